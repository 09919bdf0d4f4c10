//! Online restart between two proxy processes, the wire side: where a process's control socket
//! is, and the few messages two processes exchange over it — the listening sockets passed to a
//! new process (`SCM_RIGHTS`), its word that it serves, and a client's cancel request passed to
//! the process that owns the session. What a process does when asked is `control`'s business.
//!
//! Why the sockets are handed over rather than bound twice with `SO_REUSEPORT`: with
//! `SO_REUSEPORT` each process has its own accept queue, and Linux resets the connections
//! waiting in a queue whose socket closes, so the old process could never stop without refusing
//! the clients that arrived in its last moments. A handed-over socket is one socket with one
//! queue in both processes: the old one stops calling `accept`, the new one goes on, and a
//! connection that waits in the queue meanwhile is accepted by the new one. Nothing is refused.
//!
//! The protocol, one text line a request on a fresh connection to the socket:
//! - `TAKEOVER` — answered by `LISTEN <n>` with the `n` listening sockets (clients, then the
//!   admin port if any) attached; the new process then says `READY` on the same connection once
//!   it accepts, and the old one stops accepting. A new process that dies before `READY` closes
//!   the connection, and the old one goes on serving. A proxy that is stopping already (its
//!   listening socket closed) answers `STOPPING`: the new process binds the port itself. A
//!   refusal is `ERROR <why>`.
//! - `CANCEL <pid> <secret>` — a CancelRequest's key; no answer (as in PostgreSQL).

use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Most listening sockets one takeover passes (clients and the admin port).
pub const MAX_SOCKETS: usize = 2;

/// The control socket of process `pid` serving `port`.
pub fn socket_path(dir: &Path, port: u16, pid: u32) -> PathBuf {
    dir.join(format!("lsngate-{port}.{pid}.sock"))
}

/// The link to the control socket of the process taking new clients on `port`: where a new
/// process finds the one to take over.
pub fn serving_link(dir: &Path, port: u16) -> PathBuf {
    dir.join(format!("lsngate-{port}.sock"))
}

/// Points the serving link at `target` (replacing the old link in one rename, so a new process
/// never finds none while one serves).
pub fn publish(dir: &Path, port: u16, target: &Path) -> io::Result<()> {
    let link = serving_link(dir, port);
    let fresh = dir.join(format!(".lsngate-{port}.{}.link", std::process::id()));
    let _ = std::fs::remove_file(&fresh);
    std::os::unix::fs::symlink(target.file_name().unwrap_or(target.as_os_str()), &fresh)?;
    std::fs::rename(&fresh, &link)
}

/// Removes the serving link if it still points at `target` (a process leaving; a newer process's
/// link stays).
pub fn unpublish(dir: &Path, port: u16, target: &Path) {
    let link = serving_link(dir, port);
    if std::fs::read_link(&link).is_ok_and(|t| Some(t.as_os_str()) == target.file_name()) {
        let _ = std::fs::remove_file(link);
    }
}

/// The process ID a cancel key names: proxies put their own in the low 22 bits of the key's
/// first half (Linux's largest PID is 2^22), so any process can tell whose session it is.
pub fn pid_of_key(key_pid: i32) -> u32 {
    (key_pid as u32) & PID_MASK
}

/// The bits of a cancel key's first half that carry the process ID.
pub const PID_MASK: u32 = (1 << 22) - 1;

/// What a new process received from the one it took over.
#[derive(Debug)]
pub struct TakenOver {
    /// The listening sockets, clients' first.
    pub sockets: Vec<OwnedFd>,
    /// The connection to the old process, for [`TakenOver::ready`].
    control: UnixStream,
}

impl TakenOver {
    /// Tells the old process this one accepts now: it stops accepting.
    pub fn ready(mut self) -> io::Result<()> {
        self.control.write_all(b"READY\n")?;
        self.control.flush()
    }
}

/// Asks the process serving `port` (its link in `dir`) for its listening sockets; `Ok(None)`
/// when none answers there (no link, or a link left by a process gone) or the one there is
/// stopping.
pub fn take_over(dir: &Path, port: u16, timeout: Duration) -> io::Result<Option<TakenOver>> {
    let Some(mut control) = connect_if_there(&serving_link(dir, port))? else {
        return Ok(None);
    };
    control.set_read_timeout(Some(timeout))?;
    control.write_all(b"TAKEOVER\n")?;
    let (line, sockets) = receive_with_sockets(&control)?;
    let count: usize = match line.strip_prefix("LISTEN ") {
        Some(n) => n.trim().parse().map_err(|_| invalid(&line))?,
        // A proxy draining already closed its listening socket: nothing to take over.
        None if line.starts_with("STOPPING") => return Ok(None),
        None => {
            return Err(io::Error::other(format!(
                "the serving proxy refused the takeover: {}",
                line.trim()
            )));
        }
    };
    if count != sockets.len() || count == 0 {
        return Err(invalid(&line));
    }
    control.set_read_timeout(None)?;
    Ok(Some(TakenOver { sockets, control }))
}

/// A connection to the control socket at `path`; None when no process serves it (no socket, or
/// one left by a process gone).
fn connect_if_there(path: &Path) -> io::Result<Option<UnixStream>> {
    match UnixStream::connect(path) {
        Ok(stream) => Ok(Some(stream)),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

fn invalid(line: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("unexpected takeover answer {line:?}"),
    )
}

/// Passes a cancel key to process `pid`'s control socket; `Ok(false)` when it has none (gone).
pub fn forward_cancel(dir: &Path, port: u16, pid: u32, key: (i32, i32)) -> io::Result<bool> {
    let Some(mut stream) = connect_if_there(&socket_path(dir, port, pid))? else {
        return Ok(false);
    };
    stream.write_all(format!("CANCEL {} {}\n", key.0, key.1).as_bytes())?;
    Ok(true)
}

/// A request on the control socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Hand the listening sockets over.
    Takeover,
    /// Cancel the statement of the session with this key.
    Cancel((i32, i32)),
}

/// Parses one request line.
pub fn parse_request(line: &str) -> Option<Request> {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words[..] {
        ["TAKEOVER"] => Some(Request::Takeover),
        ["CANCEL", pid, secret] => Some(Request::Cancel((pid.parse().ok()?, secret.parse().ok()?))),
        _ => None,
    }
}

/// Sends `line` with `sockets` attached (one `sendmsg`; the line is short, so the fresh
/// connection's buffer takes it whole).
pub fn send_with_sockets(fd: RawFd, line: &str, sockets: &[RawFd]) -> io::Result<()> {
    let bytes = line.as_bytes();
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    let fds_len = std::mem::size_of_val(sockets) as u32;
    // SAFETY: CMSG_SPACE is pure arithmetic.
    let space = unsafe { libc::CMSG_SPACE(fds_len) } as usize;
    let mut control = vec![0u8; space.max(1)];
    // SAFETY: msghdr is plain data; zeroed is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !sockets.is_empty() {
        msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = space as _;
        // SAFETY: the control buffer is CMSG_SPACE(fds_len) long, room for one header and the
        // descriptors; CMSG_FIRSTHDR of it is in bounds and CMSG_DATA has fds_len bytes.
        unsafe {
            let header = libc::CMSG_FIRSTHDR(&msg);
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            (*header).cmsg_len = libc::CMSG_LEN(fds_len) as _;
            std::ptr::copy_nonoverlapping(
                sockets.as_ptr() as *const u8,
                libc::CMSG_DATA(header),
                fds_len as usize,
            );
        }
    }
    // SAFETY: msg points at live buffers (iov, control) for the duration of the call.
    let sent = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    if sent as usize != bytes.len() {
        return Err(io::Error::other("short send on the control socket"));
    }
    Ok(())
}

/// Receives one line with the descriptors attached to it.
fn receive_with_sockets(stream: &UnixStream) -> io::Result<(String, Vec<OwnedFd>)> {
    let mut data = [0u8; 256];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let fds_len = (MAX_SOCKETS * std::mem::size_of::<RawFd>()) as u32;
    // SAFETY: pure arithmetic.
    let space = unsafe { libc::CMSG_SPACE(fds_len) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: plain data, zeroed is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = space as _;
    // SAFETY: msg points at live buffers; MSG_CMSG_CLOEXEC keeps the descriptors from children.
    let received = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if received < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut sockets = Vec::new();
    // SAFETY: the kernel filled msg's control part; the CMSG_* walk stays within
    // msg_controllen, and each SCM_RIGHTS payload is an array of open descriptors now ours.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&msg);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                let payload = (*header).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let data = libc::CMSG_DATA(header) as *const RawFd;
                for i in 0..payload / std::mem::size_of::<RawFd>() {
                    sockets.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            header = libc::CMSG_NXTHDR(&msg, header);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::other(
            "the takeover answer carried more sockets than expected",
        ));
    }
    let mut line = String::from_utf8_lossy(&data[..received as usize]).into_owned();
    if !line.ends_with('\n') {
        // The rest of the line (no descriptors come after the first part).
        BufReader::new(stream).read_line(&mut line)?;
    }
    Ok((line, sockets))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_and_keys_carry_the_pid() {
        assert_eq!(parse_request("TAKEOVER\n"), Some(Request::Takeover));
        assert_eq!(
            parse_request("CANCEL 12 -7\n"),
            Some(Request::Cancel((12, -7)))
        );
        assert_eq!(parse_request("CANCEL x 1"), None);
        assert_eq!(parse_request("HELLO"), None);
        let key: i32 = (5 << 22) | 4_000_000;
        assert_eq!(pid_of_key(key), 4_000_000);
    }

    #[test]
    fn a_listening_socket_crosses_with_its_queue() {
        let dir = tempfile::tempdir().unwrap();
        let path = socket_path(dir.path(), 1, 2);
        let control = std::os::unix::net::UnixListener::bind(&path).unwrap();
        publish(dir.path(), 1, &path).unwrap();
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = tcp.local_addr().unwrap();
        // A client waiting in the queue before the handover is accepted after it.
        let waiting = std::net::TcpStream::connect(address).unwrap();
        let old = std::thread::spawn(move || {
            let (stream, _) = control.accept().unwrap();
            let mut line = String::new();
            let mut reader = BufReader::new(&stream);
            reader.read_line(&mut line).unwrap();
            assert_eq!(parse_request(&line), Some(Request::Takeover));
            send_with_sockets(stream.as_raw_fd(), "LISTEN 1\n", &[tcp.as_raw_fd()]).unwrap();
            line.clear();
            reader.read_line(&mut line).unwrap();
            assert_eq!(line, "READY\n");
        });
        let taken = take_over(dir.path(), 1, Duration::from_secs(10))
            .unwrap()
            .expect("a proxy answers");
        let listener = std::net::TcpListener::from(taken.sockets[0].try_clone().unwrap());
        taken.ready().unwrap();
        old.join().unwrap();
        assert_eq!(listener.local_addr().unwrap(), address);
        let (accepted, _) = listener.accept().unwrap();
        assert_eq!(accepted.peer_addr().unwrap(), waiting.local_addr().unwrap());
        unpublish(dir.path(), 1, &path);
        assert!(
            take_over(dir.path(), 1, Duration::from_secs(1))
                .unwrap()
                .is_none()
        );
    }
}
