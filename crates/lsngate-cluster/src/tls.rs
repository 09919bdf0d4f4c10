//! Throwaway certificate authorities and certificates for TLS test clusters, made with the
//! `openssl` command (scripts/install/proxy.sh installs it): a CA, server certificates for a
//! list of DNS names, client certificates for a role. EC P-256 keys, valid for two days.
//!
//! Key files are given to the server user with mode 0600, as PostgreSQL demands of
//! `ssl_key_file` and libpq of `sslkey`.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::Error;
use crate::process::{self, RunAs};

/// A certificate authority on disk.
#[derive(Debug, Clone)]
pub struct TestCa {
    /// The CA certificate (PEM): what `sslrootcert` names.
    pub cert: PathBuf,
    key: PathBuf,
    dir: PathBuf,
    run_as: RunAs,
}

/// A certificate signed by a [`TestCa`] and its private key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issued {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM), mode 0600, owned by the server user.
    pub key: PathBuf,
}

fn openssl(args: &[&str], what: &str) -> Result<(), Error> {
    let mut command = Command::new("openssl");
    command.args(args);
    process::run(command, what).map(drop).map_err(|e| match e {
        Error::Io { what, source } => Error::Io {
            what: format!("{what} (is openssl installed? run scripts/install/proxy.sh)"),
            source,
        },
        other => other,
    })
}

fn write(path: &Path, text: &str) -> Result<(), Error> {
    std::fs::write(path, text).map_err(|e| Error::io(format!("write {}", path.display()), e))
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("test paths are UTF-8")
}

impl TestCa {
    /// Makes a CA named `name` in `dir` (created if needed): `dir/name.crt`, `dir/name.key`.
    pub fn create(dir: &Path, name: &str) -> Result<TestCa, Error> {
        let run_as = RunAs::detect()?;
        std::fs::create_dir_all(dir).map_err(|e| Error::io("create TLS dir", e))?;
        let config = dir.join(format!("{name}.cnf"));
        write(
            &config,
            &format!(
                "[req]\ndistinguished_name = dn\nx509_extensions = v3_ca\nprompt = no\n\
                 [dn]\nCN = lsngate test CA {name}\n\
                 [v3_ca]\nbasicConstraints = critical,CA:TRUE\n\
                 keyUsage = critical,keyCertSign,cRLSign\nsubjectKeyIdentifier = hash\n"
            ),
        )?;
        let ca = TestCa {
            cert: dir.join(format!("{name}.crt")),
            key: dir.join(format!("{name}.key")),
            dir: dir.to_path_buf(),
            run_as,
        };
        openssl(
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-days",
                "2",
                "-config",
                path_str(&config),
                "-keyout",
                path_str(&ca.key),
                "-out",
                path_str(&ca.cert),
            ],
            &format!("make test CA {name}"),
        )?;
        Ok(ca)
    }

    /// Issues `dir/name.crt` and `dir/name.key` for subject `common_name` with `dns_names` as
    /// its subject alternative names (none for a client certificate, whose CN is the role).
    pub fn issue(
        &self,
        name: &str,
        common_name: &str,
        dns_names: &[&str],
    ) -> Result<Issued, Error> {
        let issued = Issued {
            cert: self.dir.join(format!("{name}.crt")),
            key: self.dir.join(format!("{name}.key")),
        };
        let csr = self.dir.join(format!("{name}.csr"));
        openssl(
            &[
                "req",
                "-new",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-subj",
                &format!("/CN={common_name}"),
                "-keyout",
                path_str(&issued.key),
                "-out",
                path_str(&csr),
            ],
            &format!("make the key of {name}"),
        )?;
        let extensions = self.dir.join(format!("{name}.ext"));
        let mut text = String::from(
            "[leaf]\nbasicConstraints = critical,CA:FALSE\n\
             keyUsage = critical,digitalSignature,keyEncipherment\n\
             extendedKeyUsage = serverAuth,clientAuth\n\
             subjectKeyIdentifier = hash\nauthorityKeyIdentifier = keyid\n",
        );
        if !dns_names.is_empty() {
            let names: Vec<String> = dns_names.iter().map(|n| format!("DNS:{n}")).collect();
            text.push_str(&format!("subjectAltName = {}\n", names.join(",")));
        }
        write(&extensions, &text)?;
        let serial = format!("0x{:x}", rand_serial());
        openssl(
            &[
                "x509",
                "-req",
                "-in",
                path_str(&csr),
                "-CA",
                path_str(&self.cert),
                "-CAkey",
                path_str(&self.key),
                "-set_serial",
                &serial,
                "-days",
                "2",
                "-extfile",
                path_str(&extensions),
                "-extensions",
                "leaf",
                "-out",
                path_str(&issued.cert),
            ],
            &format!("sign {name}"),
        )?;
        for file in [&issued.key, &issued.cert] {
            self.run_as.own(file)?;
        }
        set_mode(&issued.key, 0o600)?;
        Ok(issued)
    }
}

fn set_mode(path: &Path, mode: u32) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| Error::io(format!("chmod {}", path.display()), e))
}

/// A serial number unlikely to repeat between certificates of one CA.
fn rand_serial() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (now << 8)
        ^ NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ^ u64::from(std::process::id())
}

/// The TLS files of a cluster whose nodes accept only TLS over TCP.
#[derive(Debug, Clone)]
pub struct ClusterTls {
    /// The CA that signed the servers' certificate (and signs client certificates).
    pub ca: TestCa,
    /// The servers' certificate, for the DNS name `localhost` only (not for `127.0.0.1`).
    pub server: Issued,
}

impl ClusterTls {
    /// Makes the CA and the server certificate in `dir`.
    pub(crate) fn create(dir: &Path) -> Result<ClusterTls, Error> {
        let ca = TestCa::create(dir, "cluster-ca")?;
        let server = ca.issue("server", "localhost", &["localhost"])?;
        let run_as = RunAs::detect()?;
        run_as.own(dir)?;
        Ok(ClusterTls { ca, server })
    }

    /// The `postgresql.conf` settings: TLS on with these files; client certificates checked
    /// against the CA when pg_hba.conf asks for them (`cert`).
    pub(crate) fn settings(&self) -> Vec<(String, String)> {
        vec![
            ("ssl".into(), "on".into()),
            (
                "ssl_cert_file".into(),
                self.server.cert.display().to_string(),
            ),
            ("ssl_key_file".into(), self.server.key.display().to_string()),
            ("ssl_ca_file".into(), self.ca.cert.display().to_string()),
        ]
    }

    /// pg_hba.conf rules that refuse every TCP connection without TLS, replication included
    /// (`all` does not match replication connections).
    pub(crate) fn hba() -> Vec<String> {
        ["all", "replication"]
            .iter()
            .flat_map(|db| {
                ["0.0.0.0/0", "::/0"].map(|net| format!("hostnossl {db} all {net} reject"))
            })
            .collect()
    }
}
