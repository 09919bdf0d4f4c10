//! A `redis-server` on a free port of 127.0.0.1, in a temp dir, for tests that share floors
//! through Redis (lsngate-http's token store, the proxy's causal scopes). Debian's `redis-server`
//! (scripts/install/http.sh); no persistence; killed on drop.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` on a free port in a temp dir; killed on drop.
pub struct RedisServer {
    child: Child,
    /// The port it listens on.
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts one and waits (at most 20 s) until it listens.
    pub fn start() -> RedisServer {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = tempfile::tempdir().unwrap();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server not found: run scripts/install/http.sh");
        let server = RedisServer {
            child,
            port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    /// `redis://127.0.0.1:<port>/0`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
