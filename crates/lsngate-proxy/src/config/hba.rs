//! `auth_hba_file`: which clients may log in, and how, from a file in PostgreSQL's
//! `pg_hba.conf` format (as PgBouncer's `auth_type = hba`): the first rule whose connection
//! type, database, user and address match a login decides its method; no matching rule refuses
//! it. Read at startup and at every reload. A rule lsngate cannot apply as written (a group,
//! an `@file`, a host name, an authentication method it does not have) is refused when the file
//! is loaded, naming the line, never skipped.

use std::net::IpAddr;
use std::path::Path;

use super::ConfigError;

/// How a matching rule says a client logs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HbaMethod {
    /// No password.
    Trust,
    /// Refused.
    Reject,
    /// MD5, or SCRAM for a user whose secret is a SCRAM verifier (as PostgreSQL does).
    Md5,
    /// SCRAM-SHA-256 only: a user with an MD5 secret cannot log in.
    ScramSha256,
    /// Whatever the user's secret asks for (SCRAM or MD5); lsngate never takes a cleartext
    /// password.
    Password,
}

/// The rules of an `auth_hba_file`, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Hba {
    rules: Vec<Rule>,
}

#[derive(Debug, Clone, PartialEq)]
struct Rule {
    line: usize,
    connection: Connection,
    databases: Vec<Name>,
    users: Vec<Name>,
    address: Address,
    method: HbaMethod,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Connection {
    /// A Unix-domain socket: lsngate listens on TCP only, so it never matches.
    Local,
    Host,
    HostSsl,
    HostNoSsl,
}

#[derive(Debug, Clone, PartialEq)]
enum Name {
    All,
    /// `sameuser` (databases only): the database named like the user.
    SameUser,
    /// `replication` (databases only): lsngate proxies no replication connection.
    Replication,
    Literal(String),
}

#[derive(Debug, Clone, PartialEq)]
enum Address {
    /// `local` rules have none.
    None,
    All,
    Net {
        net: IpAddr,
        prefix: u8,
    },
}

/// One login as a rule sees it.
#[derive(Debug, Clone, Copy)]
pub struct HbaLogin<'a> {
    /// The client's address.
    pub peer: IpAddr,
    /// Whether it connected with TLS.
    pub tls: bool,
    /// Login name.
    pub user: &'a str,
    /// Database asked for.
    pub database: &'a str,
}

impl Hba {
    /// Reads and checks the file at `path`.
    pub(super) fn read(path: &Path) -> Result<Hba, ConfigError> {
        let error = |why: String| ConfigError::HbaFile {
            path: path.display().to_string(),
            why,
        };
        let text =
            std::fs::read_to_string(path).map_err(|e| error(format!("cannot read it: {e}")))?;
        Hba::parse(&text).map_err(error)
    }

    fn parse(text: &str) -> Result<Hba, String> {
        let mut rules = Vec::new();
        let mut pending = String::new();
        let mut first_line = 0;
        for (index, raw) in text.lines().enumerate() {
            if pending.is_empty() {
                first_line = index + 1;
            }
            let line = strip_comment(raw);
            // A backslash at the end continues the rule on the next line, as in PostgreSQL.
            if let Some(head) = line.trim_end().strip_suffix('\\') {
                pending.push_str(head);
                pending.push(' ');
                continue;
            }
            pending.push_str(line);
            let fields = tokens(&pending).map_err(|why| format!("line {first_line}: {why}"))?;
            pending.clear();
            if fields.is_empty() {
                continue;
            }
            rules.push(
                Rule::parse(first_line, &fields)
                    .map_err(|why| format!("line {first_line}: {why}"))?,
            );
        }
        Ok(Hba { rules })
    }

    /// The method of the first rule that matches `login`, with its line; None when no rule
    /// does (the login is refused).
    pub fn method(&self, login: HbaLogin<'_>) -> Option<(HbaMethod, usize)> {
        let peer = canonical(login.peer);
        self.rules
            .iter()
            .find(|rule| rule.matches(peer, login))
            .map(|rule| (rule.method, rule.line))
    }
}

impl Rule {
    fn parse(line: usize, fields: &[Token]) -> Result<Rule, String> {
        let text = |i: usize| fields.get(i).map(|t| t.text.as_str());
        let connection = match text(0) {
            Some("local") => Connection::Local,
            Some("host") => Connection::Host,
            Some("hostssl") => Connection::HostSsl,
            Some("hostnossl") => Connection::HostNoSsl,
            Some(other) => {
                return Err(format!(
                    "connection type {other:?}: lsngate applies local, host, hostssl and hostnossl"
                ));
            }
            None => unreachable!("empty lines are skipped"),
        };
        let databases = names(fields.get(1), "database", true)?;
        let users = names(fields.get(2), "user", false)?;
        let (address, next) = match connection {
            Connection::Local => (Address::None, 3),
            _ => address(fields.get(3), fields.get(4))?,
        };
        let method = match text(next) {
            Some("trust") => HbaMethod::Trust,
            Some("reject") => HbaMethod::Reject,
            Some("md5") => HbaMethod::Md5,
            Some("scram-sha-256") => HbaMethod::ScramSha256,
            Some("password") => HbaMethod::Password,
            Some(other) => {
                return Err(format!(
                    "method {other:?}: lsngate applies trust, reject, md5, scram-sha-256 and password"
                ));
            }
            None => {
                return Err(
                    "no authentication method; end the rule with one, e.g. scram-sha-256".into(),
                );
            }
        };
        if let Some(option) = fields.get(next + 1) {
            return Err(format!(
                "option {:?}: lsngate applies rules without options; remove it",
                option.text
            ));
        }
        Ok(Rule {
            line,
            connection,
            databases,
            users,
            address,
            method,
        })
    }

    fn matches(&self, peer: IpAddr, login: HbaLogin<'_>) -> bool {
        let connection = match self.connection {
            Connection::Local => false,
            Connection::Host => true,
            Connection::HostSsl => login.tls,
            Connection::HostNoSsl => !login.tls,
        };
        let database = self.databases.iter().any(|name| match name {
            Name::All => true,
            Name::SameUser => login.database == login.user,
            Name::Replication => false,
            Name::Literal(name) => name == login.database,
        });
        let user = self.users.iter().any(|name| match name {
            Name::Literal(name) => name == login.user,
            _ => true,
        });
        let address = match &self.address {
            Address::None => false,
            Address::All => true,
            Address::Net { net, prefix } => in_net(peer, *net, *prefix),
        };
        connection && database && user && address
    }
}

/// A field: its text, and whether it was quoted (a quoted `"all"` is a name, not the keyword).
#[derive(Debug)]
struct Token {
    text: String,
    quoted: bool,
}

fn strip_comment(line: &str) -> &str {
    let mut quoted = false;
    for (i, c) in line.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '#' if !quoted => return &line[..i],
            _ => {}
        }
    }
    line
}

/// Splits a rule into fields at whitespace; a field may hold `"quoted"` parts and commas.
fn tokens(line: &str) -> Result<Vec<Token>, String> {
    let mut out = Vec::new();
    let mut chars = line.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        let mut text = String::new();
        let mut quoted = false;
        while let Some(&c) = chars.peek() {
            if c.is_whitespace() {
                break;
            }
            chars.next();
            if c == '"' {
                quoted = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some(c) => text.push(c),
                        None => return Err("a quote is not closed".into()),
                    }
                }
            } else {
                text.push(c);
            }
        }
        out.push(Token { text, quoted });
    }
    Ok(out)
}

/// A database or user field: comma-separated names and keywords.
fn names(field: Option<&Token>, what: &str, database: bool) -> Result<Vec<Name>, String> {
    let field = field.ok_or_else(|| format!("no {what} field"))?;
    let mut out = Vec::new();
    for part in field.text.split(',') {
        let name = match part {
            "" => return Err(format!("an empty name in the {what} field")),
            _ if field.quoted => Name::Literal(part.to_string()),
            "all" => Name::All,
            "sameuser" if database => Name::SameUser,
            "replication" if database => Name::Replication,
            "samerole" | "samegroup" => {
                return Err(format!(
                    "{part}: lsngate does not know role membership; list the databases"
                ));
            }
            _ if part.starts_with('+') => {
                return Err(format!(
                    "{part}: lsngate does not know role membership; list the users"
                ));
            }
            _ if part.starts_with('@') => {
                return Err(format!(
                    "{part}: @file lists are not read; list the names here"
                ));
            }
            _ => Name::Literal(part.to_string()),
        };
        out.push(name);
    }
    Ok(out)
}

/// The address field (`all`, `a.b.c.d/n`, an IPv6 CIDR, or an address and a mask field) and the
/// index of the field after it.
fn address(field: Option<&Token>, mask: Option<&Token>) -> Result<(Address, usize), String> {
    let field = field.ok_or("no address field")?;
    let text = field.text.as_str();
    if text == "all" {
        return Ok((Address::All, 4));
    }
    if ["samehost", "samenet"].contains(&text) {
        return Err(format!("{text}: write the addresses as CIDR instead"));
    }
    if let Some((net, prefix)) = text.split_once('/') {
        let net: IpAddr = net.parse().map_err(|_| {
            format!("{text:?} is not an address in CIDR form; lsngate does not resolve host names")
        })?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| *p <= max)
            .ok_or_else(|| format!("{text:?}: the prefix length must be 0 to {max}"))?;
        return Ok((Address::Net { net, prefix }, 4));
    }
    let net: IpAddr = text.parse().map_err(|_| {
        format!("{text:?} is not an address; write a.b.c.d/n (lsngate does not resolve host names)")
    })?;
    let mask = mask
        .and_then(|m| m.text.parse::<IpAddr>().ok())
        .ok_or_else(|| format!("{text:?} needs a prefix (/n) or a mask field after it"))?;
    let prefix = match (net, mask) {
        (IpAddr::V4(_), IpAddr::V4(m)) => contiguous(&m.octets()),
        (IpAddr::V6(_), IpAddr::V6(m)) => contiguous(&m.octets()),
        _ => None,
    }
    .ok_or_else(|| format!("mask {mask} is not a contiguous mask of {text}'s family"))?;
    Ok((Address::Net { net, prefix }, 5))
}

fn contiguous(octets: &[u8]) -> Option<u8> {
    let bits: u32 = octets.iter().map(|b| b.count_ones()).sum();
    let expected = octets.iter().enumerate().all(|(i, b)| {
        let before = (i * 8) as u32;
        let ones = bits.saturating_sub(before).min(8);
        *b == (0xffu16 << (8 - ones)) as u8 || (ones == 0 && *b == 0)
    });
    expected.then_some(bits as u8)
}

/// An IPv4 client seen through an IPv6 socket as `::ffff:a.b.c.d` is matched as IPv4.
fn canonical(peer: IpAddr) -> IpAddr {
    match peer {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(peer, IpAddr::V4),
        v4 => v4,
    }
}

fn in_net(peer: IpAddr, net: IpAddr, prefix: u8) -> bool {
    let (peer, net, width) = match (peer, net) {
        (IpAddr::V4(p), IpAddr::V4(n)) => (u32::from(p) as u128, u32::from(n) as u128, 32),
        (IpAddr::V6(p), IpAddr::V6(n)) => (u128::from(p), u128::from(n), 128),
        _ => return false,
    };
    let shift = width - u32::from(prefix);
    if shift >= 128 {
        return true;
    }
    (peer >> shift) == (net >> shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn login<'a>(peer: &str, tls: bool, user: &'a str, database: &'a str) -> HbaLogin<'a> {
        HbaLogin {
            peer: peer.parse().unwrap(),
            tls,
            user,
            database,
        }
    }

    #[test]
    fn the_first_matching_rule_decides() {
        let hba = Hba::parse(
            "# TYPE DATABASE USER ADDRESS METHOD\n\
             local   all      all                      trust\n\
             host    all      blocked  0.0.0.0/0       reject\n\
             hostssl app      all      10.0.0.0/8      scram-sha-256\n\
             host    app,\"all\" legacy 10.1.0.0 255.255.0.0 md5   # a mask field\n\
             hostnossl sameuser all    ::1/128         trust\n\
             host    all      all      127.0.0.2/32    trust\n\
             host    all      all      127.0.0.0/8     \\\n\
                     password\n",
        )
        .unwrap();
        let method = |l| hba.method(l).map(|(m, _)| m);
        assert_eq!(
            method(login("127.0.0.1", false, "blocked", "app")),
            Some(HbaMethod::Reject)
        );
        assert_eq!(
            method(login("10.2.0.1", true, "u", "app")),
            Some(HbaMethod::ScramSha256)
        );
        assert_eq!(
            method(login("10.2.0.1", false, "u", "app")),
            None,
            "hostssl needs TLS"
        );
        assert_eq!(
            method(login("10.1.2.3", false, "legacy", "all")),
            Some(HbaMethod::Md5),
            "a quoted \"all\" is a name"
        );
        assert_eq!(method(login("10.1.2.3", false, "legacy", "other")), None);
        assert_eq!(
            method(login("::1", false, "bob", "bob")),
            Some(HbaMethod::Trust)
        );
        assert_eq!(method(login("::1", false, "bob", "app")), None);
        assert_eq!(
            method(login("::ffff:127.0.0.2", false, "u", "db")),
            Some(HbaMethod::Trust),
            "IPv4 through IPv6"
        );
        assert_eq!(
            hba.method(login("127.9.9.9", false, "u", "db")),
            Some((HbaMethod::Password, 8)),
            "continued lines count from their first"
        );
        assert_eq!(
            method(login("192.168.0.1", false, "u", "db")),
            None,
            "no rule: refused"
        );
    }

    #[test]
    fn rules_lsngate_cannot_apply_are_refused_with_the_line() {
        for (rule, says) in [
            ("host all +admins 0.0.0.0/0 md5", "role membership"),
            ("host samerole all 0.0.0.0/0 md5", "role membership"),
            ("host all @users.txt 0.0.0.0/0 md5", "@file"),
            ("host all all db.example 0.0.0.0/0 md5", "host names"),
            ("host all all samenet md5", "CIDR"),
            ("host all all 10.0.0.0/33 md5", "prefix length"),
            ("host all all 10.0.0.0 255.0.255.0 md5", "contiguous"),
            ("host all all 0.0.0.0/0 ldap", "method \"ldap\""),
            (
                "host all all 0.0.0.0/0 cert clientcert=verify-full",
                "method \"cert\"",
            ),
            (
                "host all all 0.0.0.0/0 scram-sha-256 clientcert=verify-ca",
                "option",
            ),
            ("hostgssenc all all 0.0.0.0/0 trust", "connection type"),
            ("host all all 0.0.0.0/0", "no authentication method"),
            ("host \"all all 0.0.0.0/0 md5", "quote is not closed"),
        ] {
            let error = Hba::parse(&format!("# header\n{rule}\n")).unwrap_err();
            assert!(
                error.starts_with("line 2: ") && error.contains(says),
                "{rule}: {error}"
            );
        }
    }
}
