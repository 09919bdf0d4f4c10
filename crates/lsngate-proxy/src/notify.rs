//! systemd's readiness protocol (`Type=notify`): one datagram of `KEY=value` lines to the unix
//! socket named by `$NOTIFY_SOCKET` (a path, or `@name` in the abstract namespace). No
//! systemd library: the protocol is that datagram. Without `$NOTIFY_SOCKET` nothing is sent, so
//! the proxy runs the same outside systemd.

use std::io;

/// The socket `$NOTIFY_SOCKET` names, if any.
fn notify_socket() -> Option<std::ffi::OsString> {
    std::env::var_os("NOTIFY_SOCKET").filter(|s| !s.is_empty())
}

/// Sends `state` (e.g. `"READY=1\nMAINPID=42"`) to the service manager; `Ok(false)` when
/// there is none to tell.
pub fn notify(state: &str) -> io::Result<bool> {
    let Some(path) = notify_socket() else {
        return Ok(false);
    };
    let socket = std::os::unix::net::UnixDatagram::unbound()?;
    let bytes = path.as_encoded_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        #[cfg(target_os = "linux")]
        {
            use std::os::linux::net::SocketAddrExt;
            let address = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            socket.send_to_addr(state.as_bytes(), &address)?;
            return Ok(true);
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = name;
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "abstract NOTIFY_SOCKET names exist on Linux only",
            ));
        }
    }
    socket.send_to(state.as_bytes(), &path)?;
    Ok(true)
}

/// [`notify`], with a failure logged rather than returned: the proxy serves on whether or not
/// the service manager heard it.
pub fn tell(state: &str) {
    if let Err(e) = notify(state) {
        tracing::warn!("could not notify the service manager ({state:?}): {e}");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_state_arrives_as_one_datagram_on_the_named_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let receiver = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        // SAFETY (set_var): this test is the only one in the crate that reads or writes
        // NOTIFY_SOCKET.
        unsafe { std::env::set_var("NOTIFY_SOCKET", &path) };
        let sent = super::notify("READY=1\nMAINPID=7");
        unsafe { std::env::remove_var("NOTIFY_SOCKET") };
        assert!(sent.unwrap());
        let mut buf = [0u8; 64];
        let n = receiver.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nMAINPID=7");
        assert!(
            !super::notify("READY=1").unwrap(),
            "no socket, nothing sent"
        );
    }
}
