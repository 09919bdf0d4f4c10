//! The control socket a proxy serves in `runtime_dir` while it runs (the protocol is
//! `handover`'s): it hands its listening sockets to a new process started with `--takeover`
//! and then drains waiting for its clients, and it cancels the statements of its sessions for
//! cancel requests that reached the new process. Not the admin console: nothing here is for
//! people.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader, Interest};
use tokio::net::{UnixListener, UnixStream};

use crate::handover::{self, Request};
use crate::proxy::{Drain, Proxy};

/// How long a peer has to send its request line.
const REQUEST_LIMIT: Duration = Duration::from_secs(10);

/// This process's control socket file, removed (and the serving link with it, if it is still
/// this process's) when dropped.
#[derive(Debug)]
pub struct ControlSocket {
    dir: PathBuf,
    port: u16,
    path: PathBuf,
}

impl ControlSocket {
    /// Binds `lsngate-PORT.PID.sock` in `dir`.
    pub fn bind(dir: &Path, port: u16) -> std::io::Result<(ControlSocket, UnixListener)> {
        let path = handover::socket_path(dir, port, std::process::id());
        // A file of a process gone with the same PID (PIDs are reused).
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)?;
        let socket = ControlSocket {
            dir: dir.to_path_buf(),
            port,
            path,
        };
        Ok((socket, listener))
    }

    /// Points the serving link here: the next `--takeover` finds this process.
    pub fn publish(&self) -> std::io::Result<()> {
        handover::publish(&self.dir, self.port, &self.path)
    }
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        handover::unpublish(&self.dir, self.port, &self.path);
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Answers the control socket for as long as the process runs.
pub async fn serve(proxy: Arc<Proxy>, listener: UnixListener) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(answer(Arc::clone(&proxy), stream));
            }
            Err(e) => {
                tracing::warn!("control socket: accept failed: {e}");
                crate::timer::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Answers one request.
async fn answer(proxy: Arc<Proxy>, stream: UnixStream) {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    let read = crate::timer::timeout(REQUEST_LIMIT, reader.read_line(&mut line)).await;
    if !matches!(read, Ok(Ok(n)) if n > 0) {
        return;
    }
    match handover::parse_request(&line) {
        Some(Request::Cancel(key)) => {
            if let Err(e) = crate::frontend::handshake::cancel_here(&proxy, key).await {
                tracing::info!("forwarded cancel request failed: {e}");
            }
        }
        Some(Request::Takeover) => hand_over(&proxy, reader).await,
        None => tracing::info!(request = %line.trim(), "control socket: unknown request"),
    }
}

/// Passes the listening sockets to the new process, then waits for its `READY` and drains.
async fn hand_over(proxy: &Proxy, mut reader: BufReader<UnixStream>) {
    let sockets: Vec<std::os::fd::RawFd> = proxy
        .listening
        .lock()
        .expect("listening lock")
        .iter()
        .map(|fd| fd.as_raw_fd())
        .collect();
    let refusal = if proxy.draining() != Drain::Serving {
        // Its listening socket is closed: the new process binds the port itself.
        Some("STOPPING this proxy accepts no more\n")
    } else if sockets.is_empty() {
        Some("ERROR this proxy is not accepting yet\n")
    } else {
        None
    };
    let stream = reader.get_mut();
    let fd = stream.as_raw_fd();
    let line = refusal.map_or_else(|| format!("LISTEN {}\n", sockets.len()), str::to_string);
    let attached = if refusal.is_some() {
        &[][..]
    } else {
        &sockets[..]
    };
    let sent = async {
        stream.writable().await?;
        stream.try_io(Interest::WRITABLE, || {
            handover::send_with_sockets(fd, &line, attached)
        })
    };
    if let Err(e) = sent.await {
        tracing::warn!("takeover: the listening sockets were not sent: {e}");
        return;
    }
    if refusal.is_some() {
        return;
    }
    tracing::info!("takeover: listening sockets handed to a new process; waiting for it to accept");
    let mut ready = String::new();
    // No bound needed: this process serves on meanwhile, and a new process that dies closes
    // the connection.
    match reader.read_line(&mut ready).await {
        Ok(_) if ready.trim() == "READY" => {
            tracing::info!(
                "takeover: the new process accepts; stopping to accept and waiting for the clients to leave"
            );
            proxy.listening.lock().expect("listening lock").clear();
            proxy.handed_over.send_replace(true);
            proxy.request_drain(Drain::WaitForClients);
        }
        _ => tracing::warn!("takeover: the new process went away before it accepted; serving on"),
    }
}
