//! Running server programs as an unprivileged user, and signalling a node's processes.
//!
//! `initdb` and `postgres` refuse to run as root. When this process is root, server programs run
//! as the `lsngate` system user that `scripts/install-postgres.sh` creates; otherwise as the
//! current user.

use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output};

use crate::Error;

/// The user server programs run as when started by root.
pub const SERVER_USER: &str = "lsngate";

/// uid/gid (and home directory) to switch to, or `None` when not root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs(Option<(u32, u32, std::path::PathBuf)>);

impl RunAs {
    pub fn detect() -> Result<RunAs, Error> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Ok(RunAs(None));
        }
        let name = CString::new(SERVER_USER).expect("no NUL");
        // SAFETY: getpwnam with a valid C string; the result is read before any other call.
        let entry = unsafe { libc::getpwnam(name.as_ptr()) };
        if entry.is_null() {
            return Err(Error::NoServerUser);
        }
        // SAFETY: non-null pointer from getpwnam; pw_dir is a C string or null.
        let (uid, gid, home) = unsafe {
            let dir = (*entry).pw_dir;
            let home = if dir.is_null() {
                std::path::PathBuf::from("/")
            } else {
                std::ffi::CStr::from_ptr(dir)
                    .to_string_lossy()
                    .into_owned()
                    .into()
            };
            ((*entry).pw_uid, (*entry).pw_gid, home)
        };
        Ok(RunAs(Some((uid, gid, home))))
    }

    /// The server user's uid and gid, or `None` when servers run as this process's user.
    pub fn ids(&self) -> Option<(u32, u32)> {
        self.0.as_ref().map(|(uid, gid, _)| (*uid, *gid))
    }

    /// A command that runs as the server user.
    pub fn command(&self, program: &Path) -> Command {
        let mut command = Command::new(program);
        if let Some((uid, gid, home)) = &self.0 {
            // Its own HOME: libpq in pg_basebackup and the walreceiver reads ~/.postgresql when
            // TLS is on, and root's is unreadable to it ("could not open certificate file").
            command.uid(*uid).gid(*gid).env("HOME", home);
        }
        command.env_remove("PGDATA").env("LC_ALL", "C");
        command
    }

    /// Gives `path` to the server user.
    pub fn own(&self, path: &Path) -> Result<(), Error> {
        if let Some((uid, gid, _)) = &self.0 {
            let (uid, gid) = (*uid, *gid);
            std::os::unix::fs::chown(path, Some(uid), Some(gid))
                .map_err(|e| Error::io(format!("chown {}", path.display()), e))?;
        }
        Ok(())
    }
}

/// Makes `command` start its process in a session of its own (`setsid` between fork and exec),
/// as a service manager would start a server: not in the caller's process group or terminal
/// session, and, with the kernel's autogroup scheduling, not sharing the caller's CPU share.
pub fn in_own_session(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: setsid is async-signal-safe, the one call made between fork and exec.
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Runs `check` every 50 ms until it succeeds, `child` exits, or `timeout` passes; the error says
/// which, with `check`'s last error. `check` runs on a runtime of its own on a thread of its own:
/// the caller may be inside another runtime. For servers whose readiness a TCP connect does not
/// prove (a pooler answers before it can serve).
pub(crate) fn wait_ready<F, Fut>(
    child: &mut std::process::Child,
    timeout: std::time::Duration,
    check: F,
) -> Result<(), String>
where
    F: Fn() -> Fut + Send,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = std::time::Instant::now() + timeout;
    std::thread::scope(|scope| {
        scope
            .spawn(move || -> Result<(), String> {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| format!("cannot build a runtime to check on it: {e}"))?;
                loop {
                    match child.try_wait() {
                        Ok(Some(status)) => return Err(format!("exited ({status})")),
                        Ok(None) => {}
                        Err(e) => return Err(format!("cannot wait for it: {e}")),
                    }
                    let error = match runtime.block_on(check()) {
                        Ok(()) => return Ok(()),
                        Err(e) => e,
                    };
                    if std::time::Instant::now() >= deadline {
                        return Err(format!(
                            "not ready within {timeout:?} (last error: {error})"
                        ));
                    }
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
            })
            .join()
            .unwrap_or_else(|_| Err("the readiness check panicked".to_string()))
    })
}

/// Runs `command`, turning a failure into an error that carries its output.
pub fn run(mut command: Command, what: &str) -> Result<Output, Error> {
    let output = command.output().map_err(|e| {
        Error::io(
            format!("{what}: cannot start {:?}", command.get_program()),
            e,
        )
    })?;
    if !output.status.success() {
        return Err(Error::Command {
            what: what.to_string(),
            status: output.status.to_string(),
            output: printed(&output),
        });
    }
    Ok(output)
}

/// What a failed program printed: its standard error, then its standard output, each on lines
/// of its own (initdb says what went wrong on stderr and narrates on stdout; glued together,
/// the error's last line ran into the narration's first).
fn printed(output: &Output) -> String {
    [&output.stderr, &output.stdout]
        .iter()
        .map(|bytes| String::from_utf8_lossy(bytes).trim().to_string())
        .filter(|text| !text.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The postmaster's pid, from `postmaster.pid`, if it is running.
pub fn postmaster_pid(data_dir: &Path) -> Option<i32> {
    let text = std::fs::read_to_string(data_dir.join("postmaster.pid")).ok()?;
    let pid: i32 = text.lines().next()?.trim().parse().ok()?;
    // SAFETY: signal 0 only checks that the process exists.
    (unsafe { libc::kill(pid, 0) } == 0).then_some(pid)
}

/// The postmaster and all its children (backends, startup, walreceiver, ...).
pub fn server_pids(data_dir: &Path) -> Vec<i32> {
    let Some(postmaster) = postmaster_pid(data_dir) else {
        return Vec::new();
    };
    let mut pids = vec![postmaster];
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // Fields after the parenthesised command name: state, ppid, ...
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok());
        if ppid == Some(postmaster) {
            pids.push(pid);
        }
    }
    pids
}

/// `root` and every process descended from it (children, their children, ...), read from
/// `/proc`: what a multi-process server such as pgpool-II is made of, for stopping it or for
/// adding up the CPU it used. Empty when `root` is gone.
pub fn process_tree(root: i32) -> Vec<i32> {
    let parents: Vec<(i32, i32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_string_lossy().parse::<i32>().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // Fields after the parenthesised command name: state, ppid, ...
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<i32>().ok())?;
            Some((pid, ppid))
        })
        .collect();
    if !parents.iter().any(|&(pid, _)| pid == root) {
        return Vec::new();
    }
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(
            parents
                .iter()
                .filter(|&&(_, ppid)| ppid == parent)
                .map(|&(pid, _)| pid),
        );
        i += 1;
    }
    tree
}

/// Sends `signal` to every process of the server in `data_dir`.
pub fn signal_server(data_dir: &Path, signal: i32) -> usize {
    let pids = server_pids(data_dir);
    for &pid in &pids {
        // SAFETY: plain kill(2) on pids we just read; a vanished pid only yields ESRCH.
        unsafe { libc::kill(pid, signal) };
    }
    pids.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_tree_holds_grandchildren() {
        let mut shell = Command::new("sh")
            .args(["-c", "sleep 30 & sh -c 'sleep 30; true' & wait"])
            .spawn()
            .unwrap();
        let root = shell.id() as i32;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut tree = process_tree(root);
        while tree.len() < 4 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
            tree = process_tree(root);
        }
        for &pid in tree.iter().rev() {
            // SAFETY: plain kill(2) on processes this test started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = shell.wait();
        // sh, its two children (a sleep, a sh) and that sh's sleep.
        assert_eq!(tree.len(), 4, "{tree:?}");
        assert_eq!(tree[0], root);
        assert!(process_tree(root).is_empty());
    }

    #[test]
    fn a_failed_program_s_stderr_and_stdout_stay_on_their_own_lines() {
        let mut command = Command::new("sh");
        command.args(["-c", "echo narration; echo 'error: it broke' >&2; exit 3"]);
        let error = run(command, "sh").unwrap_err().to_string();
        assert_eq!(
            error, "sh failed (exit status: 3):\nerror: it broke\nnarration",
            "{error}"
        );
    }
}
