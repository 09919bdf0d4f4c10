//! Password authentication, both ways: the server side of SCRAM-SHA-256 (RFC 5802/7677, no
//! channel binding), MD5 and trust that clients log in with, checked against the users in the
//! config, and the client side the proxy uses to log into servers. Pure functions over the
//! exchanged messages; the listener and the backend connection do the I/O. A leaf at the crate
//! root because three layers need it — config derives verifiers, the server side logs in, the
//! client side checks logins — and it needs none of them. Backend credentials come from the
//! config, except with `auth_query`: there the keys a client proved in its own SCRAM exchange
//! (or the MD5 hash the server stores) log the proxy in to the servers as that client's role,
//! as PgBouncer does.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{Hmac, KeyInit, Mac};
use md5::Md5;
use sha2::{Digest, Sha256};

/// How a client must prove who it is.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)] // variant fields are described by the variant docs
pub enum Credential {
    /// No password asked (local development only).
    Trust,
    /// SCRAM-SHA-256 against a verifier (from a plain password or a stored `SCRAM-SHA-256$...`).
    Scram(ScramVerifier),
    /// MD5 against `md5` + md5hex(password + user).
    Md5 { hash: String },
}

/// Why authentication failed. Messages go to the client as FATAL 28P01 / 28000.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    /// Wrong password (deliberately vague towards the client).
    #[error("password authentication failed for user \"{0}\"")]
    WrongPassword(String),
    /// The client sent something that is not a valid SCRAM message.
    #[error(
        "malformed SCRAM message: {0}; the client must speak SCRAM-SHA-256 without channel binding"
    )]
    BadScramMessage(&'static str),
    /// A stored verifier in the config cannot be parsed.
    #[error(
        "invalid SCRAM verifier for user \"{0}\": expected SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey> as in pg_authid"
    )]
    BadVerifier(String),
}

/// A SCRAM-SHA-256 verifier as PostgreSQL stores it in `pg_authid.rolpassword`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScramVerifier {
    /// PBKDF2 iterations.
    pub iterations: u32,
    /// Salt bytes.
    pub salt: Vec<u8>,
    /// H(ClientKey).
    pub stored_key: Vec<u8>,
    /// HMAC(SaltedPassword, "Server Key").
    pub server_key: Vec<u8>,
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// PBKDF2-HMAC-SHA-256 with one output block: SCRAM's Hi() function.
pub fn salted_password(password: &str, salt: &[u8], iterations: u32) -> Vec<u8> {
    let mut block = salt.to_vec();
    block.extend_from_slice(&1u32.to_be_bytes());
    let mut u = hmac(password.as_bytes(), &block);
    let mut out = u.clone();
    for _ in 1..iterations {
        u = hmac(password.as_bytes(), &u);
        out.iter_mut().zip(&u).for_each(|(o, x)| *o ^= x);
    }
    out
}

impl ScramVerifier {
    /// A verifier for a plain password with a fresh random salt.
    pub fn from_password(password: &str, iterations: u32) -> ScramVerifier {
        let salt: [u8; 16] = rand::random();
        Self::derive(password, &salt, iterations)
    }

    fn derive(password: &str, salt: &[u8], iterations: u32) -> ScramVerifier {
        let salted = salted_password(password, salt, iterations);
        let client_key = hmac(&salted, b"Client Key");
        ScramVerifier {
            iterations,
            salt: salt.to_vec(),
            stored_key: Sha256::digest(&client_key).to_vec(),
            server_key: hmac(&salted, b"Server Key"),
        }
    }

    /// Parses `SCRAM-SHA-256$4096:<salt>$<StoredKey>:<ServerKey>`.
    pub fn parse(user: &str, text: &str) -> Result<ScramVerifier, AuthError> {
        let bad = || AuthError::BadVerifier(user.to_string());
        let rest = text.strip_prefix("SCRAM-SHA-256$").ok_or_else(bad)?;
        let (params, keys) = rest.split_once('$').ok_or_else(bad)?;
        let (iterations, salt) = params.split_once(':').ok_or_else(bad)?;
        let (stored, server) = keys.split_once(':').ok_or_else(bad)?;
        Ok(ScramVerifier {
            iterations: iterations.parse().map_err(|_| bad())?,
            salt: B64.decode(salt).map_err(|_| bad())?,
            stored_key: B64.decode(stored).map_err(|_| bad())?,
            server_key: B64.decode(server).map_err(|_| bad())?,
        })
    }
}

/// `md5` + md5hex(password + user), the form PostgreSQL stores.
pub fn md5_stored(user: &str, password: &str) -> String {
    format!("md5{}", hex(&Md5::digest(format!("{password}{user}"))))
}

/// What an MD5 client must send for this stored hash and salt.
pub fn md5_response(stored: &str, salt: [u8; 4]) -> String {
    let inner = stored.strip_prefix("md5").unwrap_or(stored);
    let mut data = inner.as_bytes().to_vec();
    data.extend_from_slice(&salt);
    format!("md5{}", hex(&Md5::digest(&data)))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What the proxy proves itself with when it logs in to a server as a role.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum ServerSecret {
    /// Nothing: the server must trust the proxy.
    None,
    /// A password, for SCRAM, MD5 or cleartext.
    Password(String),
    /// The keys a client proved in its SCRAM exchange with the proxy, against a verifier the
    /// server itself stores (`auth_query`): enough for SCRAM with the same salt and iterations.
    ScramKeys {
        /// ClientKey, recovered from the client's proof.
        client_key: Vec<u8>,
        /// ServerKey, from the verifier.
        server_key: Vec<u8>,
    },
    /// The `md5…` hash the server stores (`auth_query`): enough for MD5.
    Md5Hash(String),
}

impl std::fmt::Debug for ServerSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ServerSecret::None => "None",
            ServerSecret::Password(_) => "Password(…)",
            ServerSecret::ScramKeys { .. } => "ScramKeys(…)",
            ServerSecret::Md5Hash(_) => "Md5Hash(…)",
        })
    }
}

/// A successful SCRAM exchange: what to send the client, and the key it proved.
#[derive(Debug)]
pub struct ScramProved {
    /// The server-final message (`v=<ServerSignature>`).
    pub server_final: String,
    /// The client's ClientKey, for logging in to servers as it (`ServerSecret::ScramKeys`).
    pub client_key: Vec<u8>,
}

/// Server state between SCRAM's first and final client messages.
#[derive(Debug)]
pub struct ScramExchange {
    client_first_bare: String,
    server_first: String,
    nonce: String,
}

impl ScramExchange {
    /// Takes the SASLInitialResponse data (`n,,n=,r=<nonce>`) and returns the server-first message.
    pub fn start(verifier: &ScramVerifier, client_first: &str) -> Result<ScramExchange, AuthError> {
        let bare = client_first
            .strip_prefix("n,,")
            .or_else(|| client_first.strip_prefix("y,,"))
            .ok_or(AuthError::BadScramMessage(
                "expected gs2 header 'n,,' (channel binding is not supported)",
            ))?;
        let client_nonce = bare
            .split(',')
            .find_map(|part| part.strip_prefix("r="))
            .ok_or(AuthError::BadScramMessage(
                "client-first message without nonce",
            ))?;
        let server_nonce: [u8; 18] = rand::random();
        let nonce = format!("{client_nonce}{}", B64.encode(server_nonce));
        let server_first = format!(
            "r={nonce},s={},i={}",
            B64.encode(&verifier.salt),
            verifier.iterations
        );
        Ok(ScramExchange {
            client_first_bare: bare.to_string(),
            server_first,
            nonce,
        })
    }

    /// The server-first message to send as AuthenticationSASLContinue.
    pub fn server_first(&self) -> &str {
        &self.server_first
    }

    /// Checks the client-final message; returns the server-final message and the proved key.
    pub fn finish(
        &self,
        user: &str,
        verifier: &ScramVerifier,
        client_final: &str,
    ) -> Result<ScramProved, AuthError> {
        let (without_proof, proof) =
            client_final
                .rsplit_once(",p=")
                .ok_or(AuthError::BadScramMessage(
                    "client-final message without proof",
                ))?;
        let nonce_ok = without_proof
            .split(',')
            .any(|p| p.strip_prefix("r=") == Some(self.nonce.as_str()));
        if !nonce_ok {
            return Err(AuthError::BadScramMessage("nonce does not match"));
        }
        let proof = B64
            .decode(proof)
            .map_err(|_| AuthError::BadScramMessage("proof is not base64"))?;
        let auth_message = format!(
            "{},{},{}",
            self.client_first_bare, self.server_first, without_proof
        );
        let client_signature = hmac(&verifier.stored_key, auth_message.as_bytes());
        if proof.len() != client_signature.len() {
            return Err(AuthError::WrongPassword(user.to_string()));
        }
        let client_key: Vec<u8> = proof
            .iter()
            .zip(&client_signature)
            .map(|(a, b)| a ^ b)
            .collect();
        if Sha256::digest(&client_key).as_slice() != verifier.stored_key.as_slice() {
            return Err(AuthError::WrongPassword(user.to_string()));
        }
        Ok(ScramProved {
            server_final: format!(
                "v={}",
                B64.encode(hmac(&verifier.server_key, auth_message.as_bytes()))
            ),
            client_key,
        })
    }
}

/// The client side of SCRAM, used towards backends that ask for it and by the unit tests:
/// the client-final message and the server signature to expect.
pub fn scram_client_final(
    password: &str,
    client_first_bare: &str,
    server_first: &str,
) -> Option<(String, Vec<u8>)> {
    let first = ServerFirst::parse(server_first)?;
    let salted = salted_password(password, &first.salt, first.iterations);
    let client_key = hmac(&salted, b"Client Key");
    let server_key = hmac(&salted, b"Server Key");
    Some(first.answer(client_first_bare, server_first, &client_key, &server_key))
}

/// The client side of SCRAM from keys a client proved (`ServerSecret::ScramKeys`). The keys
/// prove only the password they were derived under: a server whose secret changed since
/// refuses the proof.
pub fn scram_client_final_with_keys(
    client_key: &[u8],
    server_key: &[u8],
    client_first_bare: &str,
    server_first: &str,
) -> Option<(String, Vec<u8>)> {
    let first = ServerFirst::parse(server_first)?;
    Some(first.answer(client_first_bare, server_first, client_key, server_key))
}

/// A server-first message's parts.
struct ServerFirst<'a> {
    nonce: &'a str,
    salt: Vec<u8>,
    iterations: u32,
}

impl<'a> ServerFirst<'a> {
    fn parse(server_first: &'a str) -> Option<ServerFirst<'a>> {
        let (mut nonce, mut salt, mut iterations) = (None, None, None);
        for part in server_first.split(',') {
            match part.split_at_checked(2)? {
                ("r=", v) => nonce = Some(v),
                ("s=", v) => salt = B64.decode(v).ok(),
                ("i=", v) => iterations = v.parse().ok(),
                _ => {}
            }
        }
        Some(ServerFirst {
            nonce: nonce?,
            salt: salt?,
            iterations: iterations?,
        })
    }

    fn answer(
        &self,
        client_first_bare: &str,
        server_first: &str,
        client_key: &[u8],
        server_key: &[u8],
    ) -> (String, Vec<u8>) {
        let without_proof = format!("c=biws,r={}", self.nonce);
        let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
        let stored_key = Sha256::digest(client_key);
        let signature = hmac(&stored_key, auth_message.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&signature)
            .map(|(a, b)| a ^ b)
            .collect();
        let server_signature = hmac(server_key, auth_message.as_bytes());
        (
            format!("{without_proof},p={}", B64.encode(proof)),
            server_signature,
        )
    }
}

/// Whether the server-final message (`v=<ServerSignature>`) carries the signature the password
/// predicts: only a server that knows the verifier can send it.
pub fn scram_server_final_ok(server_final: &str, expected_signature: &[u8]) -> bool {
    server_final
        .split(',')
        .next()
        .and_then(|v| v.strip_prefix("v="))
        .and_then(|v| B64.decode(v).ok())
        .is_some_and(|signature| signature == expected_signature)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scram_accepts_the_right_password_and_rejects_a_wrong_one() {
        let verifier = ScramVerifier::from_password("s3cret", 4096);
        for (password, ok) in [("s3cret", true), ("wrong", false)] {
            let bare = "n=,r=abcdefghijkl";
            let exchange = ScramExchange::start(&verifier, &format!("n,,{bare}")).unwrap();
            let (client_final, server_sig) =
                scram_client_final(password, bare, exchange.server_first()).unwrap();
            let result = exchange.finish("app", &verifier, &client_final);
            assert_eq!(result.is_ok(), ok, "{password}");
            if ok {
                let server_final = result.unwrap().server_final;
                assert_eq!(server_final, format!("v={}", B64.encode(&server_sig)));
                assert!(scram_server_final_ok(&server_final, &server_sig));
                assert!(!scram_server_final_ok(&server_final, &server_sig[1..]));
                assert!(!scram_server_final_ok("e=invalid-proof", &server_sig));
            }
        }
    }

    #[test]
    fn keys_a_client_proved_log_in_to_a_server_holding_the_same_verifier() {
        // The server: a verifier as pg_authid holds it. The client proves its password to the
        // proxy (which has the same verifier); the proxy answers the server with the keys.
        let verifier = ScramVerifier::derive("pw", b"0123456789abcdef", 4096);
        let bare = "n=,r=clientnonce";
        let to_proxy = ScramExchange::start(&verifier, &format!("n,,{bare}")).unwrap();
        let (client_final, _) = scram_client_final("pw", bare, to_proxy.server_first()).unwrap();
        let proved = to_proxy.finish("app", &verifier, &client_final).unwrap();
        let proxy_bare = "n=,r=proxynonce";
        let server = ScramExchange::start(&verifier, &format!("n,,{proxy_bare}")).unwrap();
        let (proxy_final, expected) = scram_client_final_with_keys(
            &proved.client_key,
            &verifier.server_key,
            proxy_bare,
            server.server_first(),
        )
        .unwrap();
        let accepted = server.finish("app", &verifier, &proxy_final).unwrap();
        assert!(scram_server_final_ok(&accepted.server_final, &expected));
        // Under another verifier (the password changed) the keys prove nothing.
        let changed = ScramVerifier::derive("new", b"0123456789abcdef", 4096);
        let server = ScramExchange::start(&changed, &format!("n,,{proxy_bare}")).unwrap();
        let (proxy_final, _) = scram_client_final_with_keys(
            &proved.client_key,
            &verifier.server_key,
            proxy_bare,
            server.server_first(),
        )
        .unwrap();
        assert!(server.finish("app", &changed, &proxy_final).is_err());
    }

    #[test]
    fn stored_verifier_round_trips_and_garbage_is_rejected() {
        let v = ScramVerifier::derive("pw", b"0123456789abcdef", 4096);
        let text = format!(
            "SCRAM-SHA-256${}:{}${}:{}",
            v.iterations,
            B64.encode(&v.salt),
            B64.encode(&v.stored_key),
            B64.encode(&v.server_key)
        );
        assert_eq!(ScramVerifier::parse("u", &text).unwrap(), v);
        assert!(ScramVerifier::parse("u", "SCRAM-SHA-256$x").is_err());
        assert!(ScramExchange::start(&v, "p=tls-server-end-point,,n=,r=x").is_err());
    }

    #[test]
    fn md5_matches_postgres() {
        // SELECT 'md5' || md5('secret' || 'app') in PostgreSQL.
        assert_eq!(
            md5_stored("app", "secret"),
            format!("md5{}", hex(&Md5::digest(b"secretapp")))
        );
        let salt = [1, 2, 3, 4];
        assert_ne!(
            md5_response(&md5_stored("app", "secret"), salt),
            md5_response(&md5_stored("app", "other"), salt)
        );
    }
}
