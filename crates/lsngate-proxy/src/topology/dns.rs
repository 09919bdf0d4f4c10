//! The `dns` topology source: the members are the records of one name, as a Kubernetes
//! headless service publishes its ready pods — A/AAAA records (every address on `dns_port`) or,
//! for a name starting with `_`, SRV records (each its own host and port). Re-resolved at every
//! poll; roles come from the servers, as always. A/AAAA without `dns_server` go through the
//! system's resolver (search domains, /etc/hosts); otherwise a question goes over UDP to the
//! server, answered in `topology_poll_ms`-sized bounds. A name that does not resolve, or
//! resolves to nothing, leaves the node set as it was.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use super::patroni::Member;
use crate::config::DnsConfig;

const TYPE_A: u16 = 1;
const TYPE_AAAA: u16 = 28;
const TYPE_SRV: u16 = 33;

/// The members the name's records give, and which server answered.
pub async fn fetch(
    dns: &DnsConfig,
    timeout: Duration,
) -> Result<(Vec<Member>, String, Option<String>), String> {
    let mut addresses: Vec<(String, u16)> = if dns.is_srv() {
        let server = match dns.server {
            Some(server) => server,
            None => resolv_conf_server()?,
        };
        let mut found = Vec::new();
        for record in query(server, &dns.name, TYPE_SRV, timeout).await? {
            if let Record::Srv { port, target } = record {
                for ip in addresses_of(server, &target, timeout).await? {
                    found.push((ip.to_string(), port));
                }
            }
        }
        found
    } else {
        match dns.server {
            Some(server) => addresses_of(server, &dns.name, timeout)
                .await?
                .into_iter()
                .map(|ip| (ip.to_string(), dns.port))
                .collect(),
            None => system_lookup(&dns.name, dns.port, timeout).await?,
        }
    };
    addresses.sort();
    addresses.dedup();
    let answered_by = dns
        .server
        .map_or_else(|| "the system resolver".to_string(), |s| s.to_string());
    if addresses.is_empty() {
        return Err(format!(
            "{} has no {} records at {answered_by}; the node set stays as it was",
            dns.name,
            if dns.is_srv() { "SRV" } else { "A/AAAA" }
        ));
    }
    let members = addresses
        .into_iter()
        .map(|(host, port)| Member {
            name: crate::config::host_port(&host, port),
            role: "member".into(),
            state: "resolved".into(),
            host,
            port,
            timeline: None,
            lag: None,
            nofailover: false,
            noloadbalance: false,
        })
        .collect();
    Ok((members, answered_by, None))
}

/// The A and AAAA records of `name` at `server`.
async fn addresses_of(
    server: SocketAddr,
    name: &str,
    timeout: Duration,
) -> Result<Vec<IpAddr>, String> {
    let mut out = Vec::new();
    for kind in [TYPE_A, TYPE_AAAA] {
        for record in query(server, name, kind, timeout).await? {
            if let Record::Address(ip) = record {
                out.push(ip);
            }
        }
    }
    Ok(out)
}

async fn system_lookup(
    name: &str,
    port: u16,
    timeout: Duration,
) -> Result<Vec<(String, u16)>, String> {
    let lookup = tokio::net::lookup_host((name, port));
    let found = crate::timer::timeout(timeout, lookup)
        .await
        .map_err(|_| format!("{name}: the system resolver gave no answer in {timeout:?}"))?
        .map_err(|e| format!("{name}: {e}"))?;
    Ok(found.map(|a| (a.ip().to_string(), a.port())).collect())
}

/// The first `nameserver` of /etc/resolv.conf, for SRV questions.
fn resolv_conf_server() -> Result<SocketAddr, String> {
    let text = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    text.lines()
        .filter_map(|line| line.trim().strip_prefix("nameserver"))
        .find_map(|rest| rest.trim().parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .ok_or_else(|| {
            "no nameserver in /etc/resolv.conf to ask for SRV records; set dns_server".to_string()
        })
}

/// A record of an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Record {
    Address(IpAddr),
    Srv { port: u16, target: String },
}

/// Asks `server` one question over UDP; the answer's records of that type.
async fn query(
    server: SocketAddr,
    name: &str,
    kind: u16,
    timeout: Duration,
) -> Result<Vec<Record>, String> {
    let id: u16 = rand::random();
    let question = encode_question(id, name, kind)?;
    let bind: SocketAddr = if server.is_ipv4() {
        "0.0.0.0:0".parse().expect("address")
    } else {
        "[::]:0".parse().expect("address")
    };
    let ask = async {
        let socket = tokio::net::UdpSocket::bind(bind).await?;
        socket.connect(server).await?;
        socket.send(&question).await?;
        let mut buf = vec![0u8; 4096];
        loop {
            let n = socket.recv(&mut buf).await?;
            // Not ours (a late answer to an earlier question): wait for ours.
            if n >= 2 && u16::from_be_bytes([buf[0], buf[1]]) == id {
                buf.truncate(n);
                return Ok::<_, std::io::Error>(buf);
            }
        }
    };
    let answer = crate::timer::timeout(timeout, ask)
        .await
        .map_err(|_| format!("{server}: no answer about {name} in {timeout:?}"))?
        .map_err(|e| format!("{server}: {e}"))?;
    decode_answer(&answer, kind).map_err(|why| format!("{server} about {name}: {why}"))
}

fn encode_question(id: u16, name: &str, kind: u16) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(32 + name.len());
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&0x0100u16.to_be_bytes()); // recursion desired
    out.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]); // one question
    for label in name.trim_end_matches('.').split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(format!("{name:?} is not a DNS name"));
        }
        out.push(label.len() as u8);
        out.extend_from_slice(label.as_bytes());
    }
    out.push(0);
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&1u16.to_be_bytes()); // class IN
    Ok(out)
}

fn decode_answer(packet: &[u8], kind: u16) -> Result<Vec<Record>, String> {
    let u16_at = |at: usize| -> Result<u16, String> {
        packet
            .get(at..at + 2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
            .ok_or_else(|| "the answer is cut short".to_string())
    };
    let flags = u16_at(2)?;
    if flags & 0x8000 == 0 {
        return Err("not an answer".into());
    }
    if flags & 0x0200 != 0 {
        return Err("the answer was truncated (more records than UDP carries)".into());
    }
    match flags & 0x000f {
        0 => {}
        3 => return Ok(Vec::new()), // no such name
        code => {
            let name = match code {
                1 => "FORMERR",
                2 => "SERVFAIL",
                4 => "NOTIMP",
                5 => "REFUSED",
                _ => "an error",
            };
            return Err(format!("the server answered {name} (code {code})"));
        }
    }
    let (questions, answers) = (u16_at(4)?, u16_at(6)?);
    let mut at = 12;
    for _ in 0..questions {
        at = read_name(packet, at)?.1 + 4;
    }
    let mut records = Vec::new();
    for _ in 0..answers {
        let (_, after_name) = read_name(packet, at)?;
        let record_kind = u16_at(after_name)?;
        let length = u16_at(after_name + 8)? as usize;
        let data = after_name + 10;
        let rdata = packet
            .get(data..data + length)
            .ok_or("a record is cut short")?;
        if record_kind == kind {
            match (kind, length) {
                (TYPE_A, 4) => {
                    let octets: [u8; 4] = rdata.try_into().expect("4 bytes");
                    records.push(Record::Address(IpAddr::from(octets)));
                }
                (TYPE_AAAA, 16) => {
                    let octets: [u8; 16] = rdata.try_into().expect("16 bytes");
                    records.push(Record::Address(IpAddr::from(octets)));
                }
                (TYPE_SRV, 7..) => {
                    let port = u16_at(data + 4)?;
                    let (target, _) = read_name(packet, data + 6)?;
                    records.push(Record::Srv { port, target });
                }
                _ => return Err(format!("a record of type {kind} has {length} bytes")),
            }
        }
        at = data + length;
    }
    Ok(records)
}

/// The name at `at` (following compression pointers) and where the field after it starts.
fn read_name(packet: &[u8], mut at: usize) -> Result<(String, usize), String> {
    let mut labels: Vec<String> = Vec::new();
    let mut end = None;
    for _ in 0..128 {
        let length = *packet.get(at).ok_or("a name is cut short")? as usize;
        match length {
            0 => {
                let name = labels.join(".");
                return Ok((name, end.unwrap_or(at + 1)));
            }
            0xc0.. => {
                let low = *packet.get(at + 1).ok_or("a name is cut short")? as usize;
                end.get_or_insert(at + 2);
                at = ((length & 0x3f) << 8) | low;
            }
            64.. => return Err("a label of an unknown kind".into()),
            _ => {
                let label = packet
                    .get(at + 1..at + 1 + length)
                    .ok_or("a name is cut short")?;
                labels.push(String::from_utf8_lossy(label).into_owned());
                at += 1 + length;
            }
        }
    }
    Err("a name with a compression loop".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer as a server sends it: the question, then records whose names point back at it.
    fn answer(id: u16, name: &str, kind: u16, records: &[Vec<u8>], rcode: u16) -> Vec<u8> {
        let mut packet = encode_question(id, name, kind).unwrap();
        packet[2..4].copy_from_slice(&(0x8180u16 | rcode).to_be_bytes());
        packet[6..8].copy_from_slice(&(records.len() as u16).to_be_bytes());
        for rdata in records {
            packet.extend_from_slice(&[0xc0, 12]);
            packet.extend_from_slice(&kind.to_be_bytes());
            packet.extend_from_slice(&[0, 1, 0, 0, 0, 30]);
            packet.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
            packet.extend_from_slice(rdata);
        }
        packet
    }

    #[test]
    fn answers_decode_with_compressed_names() {
        let a = answer(
            7,
            "pg.svc",
            TYPE_A,
            &[vec![10, 0, 0, 1], vec![10, 0, 0, 2]],
            0,
        );
        assert_eq!(
            decode_answer(&a, TYPE_A).unwrap(),
            vec![
                Record::Address("10.0.0.1".parse().unwrap()),
                Record::Address("10.0.0.2".parse().unwrap())
            ]
        );
        // SRV: priority, weight, port 5433, target "db1" then a pointer to "pg.svc"'s "svc".
        let mut srv = vec![0, 10, 0, 5, 0x15, 0x39, 3, b'd', b'b', b'1'];
        srv.extend_from_slice(&[0xc0, 15]);
        let packet = answer(8, "pg.svc", TYPE_SRV, &[srv], 0);
        assert_eq!(
            decode_answer(&packet, TYPE_SRV).unwrap(),
            vec![Record::Srv {
                port: 5433,
                target: "db1.svc".into()
            }]
        );
        assert_eq!(
            decode_answer(&answer(9, "x", TYPE_A, &[], 3), TYPE_A).unwrap(),
            Vec::new()
        );
        let failed = decode_answer(&answer(9, "x", TYPE_A, &[], 2), TYPE_A).unwrap_err();
        assert!(failed.contains("SERVFAIL (code 2)"), "{failed}");
        let mut looped = answer(9, "x", TYPE_A, &[vec![1, 2, 3, 4]], 0);
        let at = looped.len() - 16;
        looped[at..at + 2].copy_from_slice(&[0xc0, at as u8]);
        assert!(decode_answer(&looped, TYPE_A).is_err());
        assert!(decode_answer(&a[..a.len() - 3], TYPE_A).is_err());
    }
}
