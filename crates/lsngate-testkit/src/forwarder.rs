//! A fault forwarder: a TCP relay on 127.0.0.1 in front of one server, whose network can be
//! made to misbehave on command — the faults a server cannot produce itself. Point a proxy or a
//! client at [`Forwarder::port`] instead of the server's port.
//!
//! - [`Fault::None`]: bytes pass both ways.
//! - [`Fault::Blackhole`]: connections stay open and nothing passes either way (a partition,
//!   a hung host): new connections are accepted and never answered.
//! - [`Fault::Reset`]: new connections are accepted and reset at once (`SO_LINGER 0`); the
//!   ones already open go on.
//!
//! Plain threads, no runtime: usable from any test.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::Error;

/// What the forwarder does to the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Fault {
    /// Relays as is.
    None = 0,
    /// Holds every connection open and passes nothing.
    Blackhole = 1,
    /// Resets each new connection as soon as it is accepted.
    Reset = 2,
}

#[derive(Debug)]
struct Shared {
    fault: AtomicU8,
    stopped: AtomicBool,
    open: Mutex<Vec<TcpStream>>,
}

impl Shared {
    fn fault(&self) -> Fault {
        match self.fault.load(Ordering::SeqCst) {
            1 => Fault::Blackhole,
            2 => Fault::Reset,
            _ => Fault::None,
        }
    }
}

/// A running forwarder; stops (closing every relayed connection) when dropped.
#[derive(Debug)]
pub struct Forwarder {
    port: u16,
    shared: Arc<Shared>,
}

impl Forwarder {
    /// Relays 127.0.0.1:(a free port) to 127.0.0.1:`target`.
    pub fn start(target: u16) -> Result<Forwarder, Error> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .map_err(|e| Error::io("bind the fault forwarder", e))?;
        let port = listener
            .local_addr()
            .map_err(|e| Error::io("fault forwarder address", e))?
            .port();
        let shared = Arc::new(Shared {
            fault: AtomicU8::new(Fault::None as u8),
            stopped: AtomicBool::new(false),
            open: Mutex::new(Vec::new()),
        });
        let accepting = Arc::clone(&shared);
        std::thread::spawn(move || accept_loop(listener, target, accepting));
        Ok(Forwarder { port, shared })
    }

    /// The port to connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Switches the fault; takes effect for the next chunk of bytes and the next connection.
    pub fn set(&self, fault: Fault) {
        self.shared.fault.store(fault as u8, Ordering::SeqCst);
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        // Wakes the accept loop, which then sees `stopped`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        for stream in self
            .shared
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

fn accept_loop(listener: TcpListener, target: u16, shared: Arc<Shared>) {
    for incoming in listener.incoming() {
        if shared.stopped.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = incoming else { continue };
        match shared.fault() {
            Fault::Reset => {
                reset(&client);
                continue;
            }
            Fault::Blackhole => {
                // Accepted, never answered: kept open until the forwarder stops.
                remember(&shared, &client);
                continue;
            }
            Fault::None => {}
        }
        let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
            reset(&client);
            continue;
        };
        remember(&shared, &client);
        remember(&shared, &server);
        for (from, to) in [(&client, &server), (&server, &client)] {
            let (Ok(from), Ok(to)) = (from.try_clone(), to.try_clone()) else {
                continue;
            };
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || pump(from, to, &shared));
        }
    }
}

fn remember(shared: &Shared, stream: &TcpStream) {
    if let Ok(copy) = stream.try_clone() {
        shared
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(copy);
    }
}

/// Closes `stream` with a RST instead of a FIN.
fn reset(stream: &TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket and a correctly sized option value.
    unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(stream),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    let _ = stream.shutdown(Shutdown::Both);
}

/// Copies `from` to `to` while the fault allows; under a blackhole, bytes read are held back
/// until it lifts.
fn pump(mut from: TcpStream, mut to: TcpStream, shared: &Shared) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut held: Vec<u8> = Vec::new();
    let mut ended = false;
    let _ = from.set_read_timeout(Some(Duration::from_millis(50)));
    loop {
        if shared.stopped.load(Ordering::SeqCst) {
            return;
        }
        let blackholed = shared.fault() == Fault::Blackhole;
        if !blackholed && !held.is_empty() {
            if to.write_all(&held).is_err() {
                return;
            }
            held.clear();
        }
        if ended {
            if !blackholed {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => ended = true,
            // Looked at again: the fault may have changed while the read waited.
            Ok(n) if shared.fault() == Fault::Blackhole => held.extend_from_slice(&buf[..n]),
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => {
                let _ = to.shutdown(Shutdown::Both);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relays_blackholes_and_resets() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let forwarder = Forwarder::start(server.local_addr().unwrap().port()).unwrap();
        let mut client = TcpStream::connect(("127.0.0.1", forwarder.port())).unwrap();
        let (mut accepted, _) = server.accept().unwrap();
        client.write_all(b"ping").unwrap();
        let mut buf = [0u8; 4];
        accepted.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"ping");

        forwarder.set(Fault::Blackhole);
        accepted.write_all(b"pong").unwrap();
        client
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        assert!(client.read(&mut buf).is_err(), "nothing passes a blackhole");
        forwarder.set(Fault::None);
        client.set_read_timeout(None).unwrap();
        client.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"pong", "held bytes pass once it lifts");

        forwarder.set(Fault::Reset);
        let mut reset = TcpStream::connect(("127.0.0.1", forwarder.port())).unwrap();
        let read = reset.read(&mut buf);
        assert!(
            matches!(&read, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset)
                || matches!(read, Ok(0)),
            "{read:?}"
        );
    }
}
