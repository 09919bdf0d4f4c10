//! Giving up on a server that stopped answering. A frozen server (SIGSTOP, a hung host) or a
//! blackholed network keeps its TCP connections open and answers nothing: a statement in flight
//! there would wait as long as the freeze lasts. When the node's health check times out, every
//! connection the proxy has to that node is shut down (`shutdown(2)` on a duplicate of its
//! socket), which wakes whoever waits on it with an end of stream. The session then does what
//! it does for any lost server: a replica read nothing of which reached the client runs on the
//! primary, anything else gets an error saying its outcome is unknown.
//!
//! The duplicate descriptor lives as long as the connection, so a shutdown can never hit a
//! descriptor number the kernel has since given to another socket. Nothing here runs per
//! statement: one `dup` per connection opened, one lock per connection opened and per sever.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// One connection's socket, as the node's registry holds it.
#[derive(Debug)]
pub struct Severable {
    socket: OwnedFd,
    reason: OnceLock<String>,
    /// What the connection is, for SHOW SERVERS on the admin console.
    pub label: OnceLock<ServerLabel>,
}

/// Who a server connection is logged in as and since when.
#[derive(Debug, Clone)]
pub struct ServerLabel {
    /// Database.
    pub database: String,
    /// Role.
    pub role: String,
    /// The server's process id.
    pub pid: i32,
    /// When it was opened.
    pub opened_at: std::time::SystemTime,
}

impl Severable {
    /// Why the connection was shut down, once it was.
    pub fn reason(&self) -> Option<&str> {
        self.reason.get().map(String::as_str)
    }
}

/// Every open connection to one node.
#[derive(Debug, Default)]
pub struct Severables(Mutex<Vec<Weak<Severable>>>);

impl Severables {
    /// Registers the socket `fd` of a new connection (duplicated: the caller keeps its own).
    pub fn register(&self, fd: RawFd) -> std::io::Result<Arc<Severable>> {
        // SAFETY: `fd` is an open socket owned by the caller for the duration of this call;
        // `dup` returns a new descriptor this OwnedFd alone owns.
        let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if copy < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let handle = Arc::new(Severable {
            // SAFETY: `copy` was just returned by fcntl and is owned by nobody else.
            socket: unsafe { OwnedFd::from_raw_fd(copy) },
            reason: OnceLock::new(),
            label: OnceLock::new(),
        });
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        // Closed connections are pruned here, so the list stays as long as the open ones.
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(&handle));
        Ok(handle)
    }

    /// Every open connection.
    pub fn open(&self) -> Vec<Arc<Severable>> {
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|w| w.strong_count() > 0);
        all.iter().filter_map(Weak::upgrade).collect()
    }

    /// Shuts down every open connection, giving `reason`; how many there were.
    pub fn sever_all(&self, reason: &str) -> usize {
        let open: Vec<Arc<Severable>> = {
            let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
            all.retain(|w| w.strong_count() > 0);
            all.iter().filter_map(Weak::upgrade).collect()
        };
        for handle in &open {
            let _ = handle.reason.set(reason.to_string());
            // SAFETY: the descriptor is open for as long as `handle` lives.
            unsafe { libc::shutdown(handle.socket.as_raw_fd(), libc::SHUT_RDWR) };
        }
        open.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn a_severed_connection_reads_the_end_and_closed_ones_are_forgotten() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_server, _) = listener.accept().unwrap();
        let registry = Severables::default();
        let handle = registry.register(client.as_raw_fd()).unwrap();
        let gone = {
            let other = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            registry.register(other.as_raw_fd()).unwrap()
        };
        drop(gone);
        assert_eq!(registry.sever_all("frozen"), 1, "only the open connection");
        let mut buf = [0u8; 8];
        assert_eq!(client.read(&mut buf).unwrap(), 0, "the reader sees the end");
        assert_eq!(handle.reason(), Some("frozen"));
    }
}
