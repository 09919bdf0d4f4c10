//! The client's side of the socket: plain TCP or TLS over it (`ClientSocket`), framed reads
//! that leave a whole simple Query in the buffer for the pass-through (`Incoming`), and one
//! write buffer flushed once per round of replies (`ClientIo`). Knows frames, not sessions.

use std::task::{Context, Poll, ready};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::net::backend::TxStatus;
use crate::net::{Frame, ProtocolError, decode_frame, whole_frame};

/// Why reading from the client failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The bytes are not PostgreSQL protocol 3 (or a message is over the size limit): the
    /// client gets a FATAL 08P01 saying so before the connection closes.
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    /// The socket failed: nothing can be said to the client.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// A client connection: plain TCP or TLS over it.
pub trait ClientSocket: AsyncRead + AsyncWrite + Unpin + Send {
    /// Writes what the socket takes right now without waiting (plain TCP); `WouldBlock` when it
    /// cannot say without the async path (TLS).
    fn write_now(&self, _buf: &[u8]) -> std::io::Result<usize> {
        Err(std::io::ErrorKind::WouldBlock.into())
    }

    /// Reads what is there into `buf`'s spare room, once there is something; 0 at the end.
    fn poll_recv(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut BytesMut,
    ) -> Poll<std::io::Result<usize>> {
        crate::net::room_to_read(buf); // a read into no room would look like the end
        let mut read = tokio::io::ReadBuf::uninit(buf.spare_capacity_mut());
        ready!(std::pin::Pin::new(&mut *self).poll_read(cx, &mut read))?;
        let n = read.filled().len();
        // SAFETY: poll_read initialised the first `n` bytes of the spare room.
        unsafe { buf.set_len(buf.len() + n) };
        Poll::Ready(Ok(n))
    }
}

impl ClientSocket for tokio::net::TcpStream {
    fn write_now(&self, buf: &[u8]) -> std::io::Result<usize> {
        crate::socket::try_send(self, buf)
    }

    fn poll_recv(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut BytesMut,
    ) -> Poll<std::io::Result<usize>> {
        crate::socket::poll_recv(self, cx, buf)
    }
}

impl<S: ClientSocket> ClientSocket for tokio_rustls::server::TlsStream<S> {}

impl ClientSocket for Box<dyn ClientSocket> {
    fn write_now(&self, buf: &[u8]) -> std::io::Result<usize> {
        (**self).write_now(buf)
    }

    fn poll_recv(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut BytesMut,
    ) -> Poll<std::io::Result<usize>> {
        (**self).poll_recv(cx, buf)
    }
}

/// The client's socket with its read and write buffers.
pub struct ClientIo {
    stream: Box<dyn ClientSocket>,
    read_buf: BytesMut,
    write_buf: BytesMut,
    max_len: usize,
    /// SHOW STATS' counting, once the session knows its database (`count_into`).
    clock: Option<crate::traffic::QueryClock>,
}

impl std::fmt::Debug for ClientIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientIo")
            .field("buffered", &self.read_buf.len())
            .finish_non_exhaustive()
    }
}

impl ClientIo {
    /// Lends the read buffer out (the pass-through sends a whole Query straight from it, and
    /// nothing else reads the client meanwhile); [`ClientIo::restore_read_buf`] gives it back.
    pub fn lend_read_buf(&mut self) -> BytesMut {
        std::mem::take(&mut self.read_buf)
    }

    /// Takes back the buffer [`ClientIo::lend_read_buf`] lent.
    pub fn restore_read_buf(&mut self, buf: BytesMut) {
        self.read_buf = buf;
    }

    /// Drops the first `len` buffered bytes: a message handled in place.
    pub fn skip(&mut self, len: usize) {
        self.read_buf.advance(len);
    }

    /// Wraps an accepted socket; `read_buf` holds bytes already read during startup.
    pub fn new(stream: Box<dyn ClientSocket>, read_buf: BytesMut, max_len: usize) -> ClientIo {
        ClientIo {
            stream,
            read_buf,
            write_buf: BytesMut::with_capacity(16 * 1024),
            max_len,
            clock: None,
        }
    }

    /// Counts queries, transactions and bytes from now on into `traffic` (SHOW STATS).
    pub fn count_into(&mut self, traffic: std::sync::Arc<crate::traffic::Traffic>) {
        self.clock = Some(crate::traffic::QueryClock::new(traffic));
    }

    /// The next message, `None` when the client closed the connection. Cancel-safe.
    pub async fn recv(&mut self) -> Result<Option<Frame>, ReadError> {
        Ok(match self.incoming().await? {
            Some(Incoming::Query(_)) => Some(self.take_buffered()),
            Some(Incoming::Frame(frame)) => Some(frame),
            None => None,
        })
    }

    /// What the client sent next, `None` when it closed the connection. A simple Query stays in
    /// the read buffer (see [`Incoming::Query`]). Cancel-safe.
    // A plain poll_fn, not an async fn: no state machine of its own around the read loop, which
    // runs for every message (about 50 instructions per statement under callgrind).
    pub fn incoming(
        &mut self,
    ) -> impl Future<Output = Result<Option<Incoming>, ReadError>> + Send + '_ {
        std::future::poll_fn(move |cx| self.poll_next(cx))
    }

    /// [`ClientIo::incoming`] as a poll.
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Incoming>, ReadError>> {
        loop {
            if let Some(len) = whole_frame(&mut self.read_buf, self.max_len)? {
                if let Some(clock) = &mut self.clock {
                    clock.message();
                }
                if self.read_buf[0] == b'Q' {
                    return Poll::Ready(Ok(Some(Incoming::Query(len))));
                }
                let frame = decode_frame(&mut self.read_buf, self.max_len)?;
                return Poll::Ready(Ok(Some(Incoming::Frame(frame.expect("a whole frame")))));
            }
            let read = ready!(self.stream.poll_recv(cx, &mut self.read_buf))?;
            if read == 0 {
                return Poll::Ready(Ok(None));
            }
            if let Some(clock) = &self.clock {
                clock.traffic().received(read);
            }
        }
    }

    /// Takes the whole message at the front of the read buffer (after [`Incoming::Query`]).
    pub fn take_buffered(&mut self) -> Frame {
        decode_frame(&mut self.read_buf, usize::MAX)
            .ok()
            .flatten()
            .expect("a whole message is buffered")
    }

    /// Buffers a frame for the client.
    pub fn queue(&mut self, frame: &Frame) {
        if frame.tag == b'Z'
            && let Some(clock) = &mut self.clock
        {
            clock.ready(frame.body.first() == Some(&TxStatus::Idle.byte()));
        }
        frame.encode(&mut self.write_buf);
    }

    /// Buffers a ReadyForQuery with transaction status `status` (written as bytes: one ends
    /// every transaction).
    pub fn queue_ready(&mut self, status: TxStatus) {
        if let Some(clock) = &mut self.clock {
            clock.ready(status == TxStatus::Idle);
        }
        self.write_buf
            .extend_from_slice(&[b'Z', 0, 0, 0, 5, status.byte()]);
    }

    /// The write buffer, for bytes relayed as they are.
    pub fn out(&mut self) -> &mut BytesMut {
        &mut self.write_buf
    }

    /// Bytes queued and not yet written.
    pub fn queued(&self) -> usize {
        self.write_buf.len()
    }

    /// Writes everything queued.
    pub async fn flush(&mut self) -> std::io::Result<()> {
        if self.write_buf.is_empty() {
            return Ok(());
        }
        if let Some(clock) = &self.clock {
            clock.traffic().sent(self.write_buf.len());
        }
        // A reply nearly always fits the socket buffer: one non-blocking write, no future.
        let written = match self.stream.write_now(&self.write_buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
            Err(e) => return Err(e),
        };
        if written < self.write_buf.len() {
            self.stream.write_all(&self.write_buf[written..]).await?;
        }
        self.write_buf.clear();
        Ok(())
    }
}

/// A client message, as `ClientIo::incoming` found it.
#[derive(Debug)]
pub enum Incoming {
    /// A whole simple Query of this many bytes (tag and length included) at the front of the
    /// read buffer, not taken out yet: the pass-through sends it on from there.
    Query(usize),
    /// Any other message, taken out.
    Frame(Frame),
}
