//! Reads and writes on a plain TCP socket, with tokio's readiness and the kernel's calls directly.
//!
//! A pooler reads twice and writes twice per statement. Through tokio's `AsyncRead` / `AsyncWrite`
//! and std's socket each of these passes several layers, and glibc wraps `recv` and `send` as
//! thread cancellation points (two more calls each); together about a tenth of the proxy's own
//! instructions per passed-through statement under callgrind. These functions keep what matters
//! from tokio — readiness, the cooperative budget, and clearing readiness after a read that did
//! not fill the buffer (the socket is drained then: edge-triggered epoll, no `recv` that only
//! returns `EAGAIN`) — and make the system call themselves. TLS connections keep the generic path.

use std::io;
use std::os::fd::AsRawFd;
use std::task::{Context, Poll, ready};

use bytes::BytesMut;
use tokio::io::Interest;
use tokio::net::TcpStream;

/// A socket system call (its six arguments), retried when a signal interrupted it; the count
/// it returned, or the error.
///
/// # Safety
/// The arguments must be valid for `call`: a buffer pointer must be valid for its length.
unsafe fn socket_call(call: libc::c_long, args: [libc::c_long; 6]) -> io::Result<usize> {
    loop {
        // SAFETY: the arguments are valid for `call` (this function's contract).
        let n =
            unsafe { libc::syscall(call, args[0], args[1], args[2], args[3], args[4], args[5]) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Reads what the socket holds into `buf`'s spare room (made first, see
/// [`crate::net::room_to_read`]), once it is readable; `Ok(0)` when the peer closed the
/// connection.
pub fn poll_recv(
    stream: &TcpStream,
    cx: &mut Context<'_>,
    buf: &mut BytesMut,
) -> Poll<io::Result<usize>> {
    crate::net::room_to_read(buf);
    loop {
        ready!(stream.poll_read_ready(cx))?;
        let room = buf.spare_capacity_mut();
        let (ptr, len) = (room.as_mut_ptr(), room.len());
        let mut received = None;
        let attempt = stream.try_io(Interest::READABLE, || {
            let fd = stream.as_raw_fd() as libc::c_long;
            let args = [fd, ptr as _, len as _, 0, 0, 0];
            // SAFETY: `ptr` and `len` describe `buf`'s spare room, writable memory that outlives
            // the call; recvfrom writes at most `len` bytes there.
            let n = unsafe { socket_call(libc::SYS_recvfrom, args) }?;
            received = Some(n);
            if n > 0 && n < len {
                // Less than the room: the socket is drained. Reported as WouldBlock so tokio
                // clears its readiness; the bytes are kept in `received`.
                return Err(io::ErrorKind::WouldBlock.into());
            }
            Ok(n)
        });
        if let Some(n) = received {
            // SAFETY: the kernel initialised the first `n` bytes of the spare room.
            unsafe { buf.set_len(buf.len() + n) };
            return Poll::Ready(Ok(n));
        }
        match attempt {
            // Readiness was stale and is cleared now: poll again, which registers the waker.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Poll::Ready(Err(e)),
            Ok(_) => unreachable!("a successful read records its length"),
        }
    }
}

/// Writes what the socket takes now, without waiting; `WouldBlock` when it takes nothing.
pub fn try_send(stream: &TcpStream, bytes: &[u8]) -> io::Result<usize> {
    stream.try_io(Interest::WRITABLE, || {
        let fd = stream.as_raw_fd() as libc::c_long;
        let flags = libc::MSG_NOSIGNAL as libc::c_long;
        let args = [fd, bytes.as_ptr() as _, bytes.len() as _, flags, 0, 0];
        // SAFETY: `bytes` is readable for its length during the call.
        unsafe { socket_call(libc::SYS_sendto, args) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (connected, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (connected.unwrap(), accepted.unwrap().0)
    }

    async fn recv(stream: &TcpStream, buf: &mut BytesMut) -> usize {
        std::future::poll_fn(|cx| poll_recv(stream, cx, buf))
            .await
            .unwrap()
    }

    fn runtime() -> tokio::runtime::Runtime {
        crate::runtime(1).unwrap()
    }

    #[test]
    fn reads_what_arrives_waits_for_more_and_sees_the_close() {
        runtime().block_on(async {
            let (a, mut b) = pair().await;
            // No room at all: some is made, and the read is not taken for the end.
            let mut buf = BytesMut::new();
            b.write_all(b"hello").await.unwrap();
            assert_eq!(recv(&a, &mut buf).await, 5);
            // The short read cleared readiness: the next read waits for the next bytes.
            let writer = async {
                tokio::task::yield_now().await;
                b.write_all(b" world").await.unwrap();
                b
            };
            let (n, b) = tokio::join!(recv(&a, &mut buf), writer);
            assert_eq!(n, 6);
            assert_eq!(&buf[..], b"hello world");
            drop(b);
            assert_eq!(recv(&a, &mut buf).await, 0, "closed");
        });
    }

    #[test]
    fn a_read_that_fills_the_room_leaves_the_rest_for_the_next() {
        runtime().block_on(async {
            let (a, mut b) = pair().await;
            let sent: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
            let writer = async {
                b.write_all(&sent).await.unwrap();
                b.shutdown().await.unwrap();
                b
            };
            let reader = async {
                let mut buf = BytesMut::new();
                loop {
                    buf.reserve(1000);
                    if recv(&a, &mut buf).await == 0 {
                        return buf;
                    }
                }
            };
            let (_b, buf) = tokio::join!(writer, reader);
            assert_eq!(&buf[..], &sent[..]);
        });
    }

    #[test]
    fn sends_without_waiting_and_says_when_the_socket_is_full() {
        runtime().block_on(async {
            let (a, mut b) = pair().await;
            assert_eq!(try_send(&a, b"ping").unwrap(), 4);
            let mut got = [0u8; 4];
            b.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, b"ping");
            // Nobody reads `b`: the socket buffers fill and a send is refused, not blocked on.
            let chunk = vec![7u8; 1 << 20];
            let full = (0..1000).find_map(|_| match try_send(&a, &chunk) {
                Err(e) => Some(e.kind()),
                Ok(_) => None,
            });
            assert_eq!(full, Some(io::ErrorKind::WouldBlock));
        });
    }
}
