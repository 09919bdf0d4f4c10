//! A fault forwarder: a TCP relay on 127.0.0.1 in front of one server, whose network can be
//! made to misbehave on command — the faults a server cannot produce itself. Point a proxy or a
//! client at [`Forwarder::port`] instead of the server's port.
//!
//! - [`Fault::None`]: bytes pass both ways.
//! - [`Fault::Blackhole`]: connections stay open and nothing passes either way (a partition,
//!   a hung host): new connections are accepted and never answered.
//! - [`Fault::Reset`]: new connections are accepted and reset at once (`SO_LINGER 0`); the
//!   ones already open go on.
//! - [`Fault::Latency`]: every chunk of bytes, each way, is held for the latency given to
//!   [`Forwarder::set_latency`] before it passes (a slow or congested link).
//! - [`Fault::CutAfterReady`]: the next connection the server answers on is cut right after the
//!   server's next ReadyForQuery: that message reaches the client, nothing after it does, both
//!   sides are reset, and the fault becomes [`Fault::Reset`] (the server stays unreachable).
//!   Arm it while the connection is idle, so the server's stream is at a message boundary.
//!
//! Connections whose first bytes from the client contain a pattern given to
//! [`Forwarder::spare`] (an `application_name` in a plaintext startup packet, say) are never
//! faulted.
//!
//! Plain threads, no runtime: usable from any test.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
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
    /// Cuts the next server answer after its ReadyForQuery, then resets new connections.
    CutAfterReady = 3,
    /// Delays every chunk each way by the latency set with [`Forwarder::set_latency`].
    Latency = 4,
}

#[derive(Debug)]
struct Shared {
    target: std::sync::atomic::AtomicU16,
    fault: AtomicU8,
    latency_ms: AtomicU64,
    stopped: AtomicBool,
    open: Mutex<Vec<TcpStream>>,
    spared: Mutex<Vec<Vec<u8>>>,
}

impl Shared {
    fn fault(&self) -> Fault {
        match self.fault.load(Ordering::SeqCst) {
            1 => Fault::Blackhole,
            2 => Fault::Reset,
            3 => Fault::CutAfterReady,
            4 => Fault::Latency,
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
            target: std::sync::atomic::AtomicU16::new(target),
            fault: AtomicU8::new(Fault::None as u8),
            latency_ms: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
            open: Mutex::new(Vec::new()),
            spared: Mutex::new(Vec::new()),
        });
        let accepting = Arc::clone(&shared);
        std::thread::spawn(move || accept_loop(listener, accepting));
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

    /// Adds `latency` to every chunk each way from now on ([`Fault::Latency`]); `set(Fault::None)`
    /// lifts it.
    pub fn set_latency(&self, latency: Duration) {
        self.shared
            .latency_ms
            .store(latency.as_millis() as u64, Ordering::SeqCst);
        self.set(Fault::Latency);
    }

    /// Sends new connections to 127.0.0.1:`target` from now on (a virtual IP moving to a
    /// promoted server); open ones stay where they are.
    pub fn set_target(&self, target: u16) {
        self.shared.target.store(target, Ordering::SeqCst);
    }

    /// Never faults connections whose first client bytes contain `pattern` (accepted while no
    /// fault is set, as they are then told apart).
    pub fn spare(&self, pattern: &str) {
        self.shared
            .spared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(pattern.as_bytes().to_vec());
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

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
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
            Fault::None | Fault::CutAfterReady | Fault::Latency => {}
        }
        let target = shared.target.load(Ordering::SeqCst);
        let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
            reset(&client);
            continue;
        };
        remember(&shared, &client);
        remember(&shared, &server);
        let spared = Arc::new(AtomicU8::new(UNDECIDED));
        for (from, to, from_server) in [(&client, &server, false), (&server, &client, true)] {
            let (Ok(from), Ok(to)) = (from.try_clone(), to.try_clone()) else {
                continue;
            };
            let link = Link {
                from,
                to,
                from_server,
                spared: Arc::clone(&spared),
            };
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || pump(link, &shared));
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

const UNDECIDED: u8 = 0;
const FAULTED: u8 = 1;
const SPARED: u8 = 2;

/// One direction of a relayed connection.
struct Link {
    from: TcpStream,
    to: TcpStream,
    from_server: bool,
    /// Whether the connection is spared, decided from the client's first bytes.
    spared: Arc<AtomicU8>,
}

impl Link {
    fn spared(&self) -> bool {
        self.spared.load(Ordering::SeqCst) == SPARED
    }

    /// Decides from the client's first bytes whether the connection is spared (an SSLRequest
    /// or GSSENCRequest first is looked past: the startup packet follows it).
    fn decide(&self, first: &[u8], shared: &Shared) {
        let negotiation = first.len() == 8
            && first[..4] == [0, 0, 0, 8]
            && matches!(first[4..], [4, 210, 22, 47] | [4, 210, 22, 48]);
        if negotiation {
            return;
        }
        let patterns = shared.spared.lock().unwrap_or_else(|p| p.into_inner());
        let spared = patterns
            .iter()
            .any(|p| first.windows(p.len()).any(|w| w == p.as_slice()));
        let _ = self.spared.compare_exchange(
            UNDECIDED,
            if spared { SPARED } else { FAULTED },
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
    }

    /// The fault that applies to this connection now.
    fn fault(&self, shared: &Shared) -> Fault {
        if self.spared() {
            Fault::None
        } else {
            shared.fault()
        }
    }
}

/// The length of `bytes` up to and including the first whole ReadyForQuery, if there is one
/// (`bytes` starting at a message boundary).
fn through_ready(bytes: &[u8]) -> Option<usize> {
    let mut at = 0;
    while bytes.len() >= at + 5 {
        let len = u32::from_be_bytes(bytes[at + 1..at + 5].try_into().ok()?) as usize;
        let end = at + 1 + len;
        if bytes.len() < end {
            return None;
        }
        if bytes[at] == b'Z' {
            return Some(end);
        }
        at = end;
    }
    None
}

/// Copies one direction while the fault allows; under a blackhole, bytes read are held back
/// until it lifts.
fn pump(mut link: Link, shared: &Shared) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut held: Vec<u8> = Vec::new();
    // Server bytes read while a cut is armed, until its ReadyForQuery is in.
    let mut cutting: Vec<u8> = Vec::new();
    let mut ended = false;
    let _ = link.from.set_read_timeout(Some(Duration::from_millis(50)));
    loop {
        if shared.stopped.load(Ordering::SeqCst) {
            return;
        }
        let blackholed = link.fault(shared) == Fault::Blackhole;
        if !blackholed && !held.is_empty() {
            if link.to.write_all(&held).is_err() {
                return;
            }
            held.clear();
        }
        if ended {
            if !blackholed {
                let _ = link.to.shutdown(Shutdown::Write);
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        let n = match link.from.read(&mut buf) {
            Ok(0) => {
                ended = true;
                continue;
            }
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue;
            }
            Err(_) => {
                let _ = link.to.shutdown(Shutdown::Both);
                return;
            }
        };
        if !link.from_server {
            link.decide(&buf[..n], shared);
        }
        // Looked at again: the fault may have changed while the read waited.
        match link.fault(shared) {
            Fault::Blackhole => held.extend_from_slice(&buf[..n]),
            Fault::CutAfterReady if link.from_server => {
                cutting.extend_from_slice(&buf[..n]);
                if let Some(end) = through_ready(&cutting) {
                    let _ = link.to.write_all(&cutting[..end]);
                    shared.fault.store(Fault::Reset as u8, Ordering::SeqCst);
                    reset(&link.to);
                    reset(&link.from);
                    return;
                }
            }
            fault => {
                if fault == Fault::Latency {
                    let ms = shared.latency_ms.load(Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(ms));
                }
                if link.to.write_all(&buf[..n]).is_err() {
                    return;
                }
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

        forwarder.set_latency(Duration::from_millis(200));
        let sent = std::time::Instant::now();
        client.write_all(b"slow").unwrap();
        accepted.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"slow");
        assert!(
            sent.elapsed() >= Duration::from_millis(200),
            "held for the latency"
        );
        forwarder.set(Fault::None);

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
