//! The cluster directory: where `lsngate cluster` puts one by default, and making sure the user
//! the servers run as can use the one asked for before any server program runs.
//!
//! As root, servers run as the `lsngate` user (initdb refuses root), so every parent of the
//! cluster directory must let that user in. A clone under `/root` (mode 0700) does not, and
//! initdb used to find that out itself with a bare "Permission denied"; the default directory
//! therefore lives in the temp dir, and an explicit directory out of that user's reach is refused
//! up front, naming the parent that blocks it. Opening up `/root` is never the fix offered.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::Error;
use crate::cluster::MANIFEST;
use crate::pgbin::PgBin;
use crate::process::RunAs;

/// Where `lsngate cluster` puts its cluster unless told otherwise:
/// `$TMPDIR/lsngate-cluster-<user>` (`/tmp/lsngate-cluster-root` for root). Not the current
/// directory: the servers' user may not be able to enter it, and one place per user lets
/// `lsngate cluster status|down` and `lsngate lag` find the cluster from anywhere.
pub fn default_cluster_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    std::env::temp_dir().join(format!("lsngate-cluster-{}", user_name(me)))
}

/// The login name of `uid`, or the number when it has none.
pub(crate) fn user_name(uid: u32) -> String {
    // SAFETY: getpwuid's result is copied out before any other call that could reuse its
    // buffer.
    unsafe {
        let entry = libc::getpwuid(uid);
        if entry.is_null() || (*entry).pw_name.is_null() {
            return uid.to_string();
        }
        std::ffi::CStr::from_ptr((*entry).pw_name)
            .to_string_lossy()
            .into_owned()
    }
}

/// Creates (or takes, if empty of a cluster) `requested`, or a fresh temp dir, and gives it to
/// the server user. Fails before anything runs if that user cannot reach it.
pub(crate) fn make_dir(
    requested: Option<&Path>,
    run_as: &RunAs,
    bin: &PgBin,
) -> Result<PathBuf, Error> {
    let dir = match requested {
        Some(dir) => take_dir(dir, run_as, bin)?,
        None => tempfile::Builder::new()
            .prefix("lsngate-")
            .tempdir()
            .map_err(|e| Error::io("create temp dir", e))?
            .keep(),
    };
    run_as.own(&dir)?;
    Ok(dir)
}

fn take_dir(dir: &Path, run_as: &RunAs, bin: &PgBin) -> Result<PathBuf, Error> {
    if dir.join(MANIFEST).exists() {
        return Err(Error::DirInUse(dir.to_path_buf()));
    }
    let existed = std::fs::symlink_metadata(dir).is_ok();
    if existed {
        // Chowning someone else's directory (or one another user planted where the default
        // goes, e.g. a symlink in /tmp) to the server user would hand it over: refuse.
        check_owner(dir, std::fs::symlink_metadata(dir), run_as)?;
        check_owner(dir, std::fs::metadata(dir), run_as)?;
    }
    let absolute = std::path::absolute(dir).map_err(|e| Error::io("resolve cluster dir", e))?;
    let first_existing = absolute
        .ancestors()
        .find(|a| a.exists())
        .unwrap_or(Path::new("/"))
        .to_path_buf();
    std::fs::create_dir_all(dir).map_err(|e| Error::io("create cluster dir", e))?;
    let dir = dir
        .canonicalize()
        .map_err(|e| Error::io("resolve cluster dir", e))?;
    if let Err(error) = check_reachable(&dir, run_as, bin) {
        // Leave nothing behind: remove the (empty) directories created above, deepest first.
        for created in absolute.ancestors().take_while(|a| *a != first_existing) {
            let _ = std::fs::remove_dir(created);
        }
        return Err(error);
    }
    Ok(dir)
}

fn check_owner(
    dir: &Path,
    metadata: std::io::Result<std::fs::Metadata>,
    run_as: &RunAs,
) -> Result<(), Error> {
    let metadata = metadata.map_err(|e| Error::io(format!("inspect {}", dir.display()), e))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let server = run_as.ids().map(|(uid, _)| uid);
    if metadata.uid() == me || Some(metadata.uid()) == server {
        return Ok(());
    }
    Err(Error::DirNotOurs {
        dir: dir.to_path_buf(),
        owner: metadata.uid(),
    })
}

/// As the server user, enters the directory's parent: the one thing initdb and the servers need
/// from the path above the cluster directory (which is theirs). Running a real program as that
/// user, rather than reading mode bits, also honours ACLs and mount options.
fn check_reachable(dir: &Path, run_as: &RunAs, bin: &PgBin) -> Result<(), Error> {
    let Some((uid, gid)) = run_as.ids() else {
        return Ok(()); // servers run as this user, who just created the directory
    };
    let parent = dir.parent().unwrap_or(Path::new("/"));
    let mut probe = run_as.command(&bin.tool("pg_ctl"));
    probe
        .arg("--version")
        .current_dir(parent)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let error = match probe.status() {
        Ok(_) => return Ok(()),
        Err(error) => error,
    };
    let why = match blocking_parent(parent, uid, gid) {
        Some((blocker, mode, owner)) => format!(
            "cannot enter {} (mode {:04o}, owner {})",
            blocker.display(),
            mode & 0o7777,
            user_name(owner)
        ),
        None => format!(
            "cannot run {} in {}: {error}",
            bin.tool("pg_ctl").display(),
            parent.display()
        ),
    };
    Err(Error::DirUnreachable {
        dir: dir.to_path_buf(),
        why,
    })
}

/// The first directory from `/` down to `path` whose mode bits deny `uid`/`gid` search
/// permission, with its mode and owner. Supplementary groups do not count: server programs run
/// with none.
fn blocking_parent(path: &Path, uid: u32, gid: u32) -> Option<(PathBuf, u32, u32)> {
    let mut chain: Vec<&Path> = path.ancestors().collect();
    chain.reverse();
    chain.into_iter().find_map(|dir| {
        let metadata = std::fs::metadata(dir).ok()?;
        let mode = metadata.permissions().mode();
        let search = if metadata.uid() == uid {
            mode & 0o100
        } else if metadata.gid() == gid {
            mode & 0o010
        } else {
            mode & 0o001
        };
        (search == 0).then(|| (dir.to_path_buf(), mode, metadata.uid()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_per_user_in_the_temp_dir() {
        let dir = default_cluster_dir();
        assert_eq!(dir.parent(), Some(std::env::temp_dir().as_path()));
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        assert_eq!(name, format!("lsngate-cluster-{}", user_name(me)));
    }

    #[test]
    fn blocking_parent_names_the_first_closed_directory() {
        let top = tempfile::tempdir().unwrap();
        std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let closed = top.path().join("closed");
        let inner = closed.join("inner");
        std::fs::create_dir_all(&inner).unwrap();
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
        // A uid and gid that own nothing here: only the "other" bits apply to them.
        let (nobody, nogroup) = (4_000_000, 4_000_000);
        let found = blocking_parent(&inner, nobody, nogroup).map(|(dir, mode, _)| (dir, mode));
        assert_eq!(found, Some((closed.clone(), 0o40700)));
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o711)).unwrap();
        assert_eq!(blocking_parent(&inner, nobody, nogroup), None);
    }
}
