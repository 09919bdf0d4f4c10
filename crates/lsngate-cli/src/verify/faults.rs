//! The fault schedule over a local cluster: a seeded sequence of faults on the replicas (and the
//! primary's crash and restart), each
//! injected, held, healed and recorded as a [`FaultWindow`] for the history. Time is cut into
//! periods; each period holds one fault, starting 10–30 % into it and lasting 40–70 % of it; the
//! kinds come in rounds, each round every requested kind once in a seeded order, so a run of
//! `kinds × period` injects every kind at least once and the same seed replays the same schedule.
//! On hosts lsngate does not own, a `--fault-hook` program the user writes injects and heals
//! each fault instead. Not the workload (which never learns what is injected) nor the checker.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lsngate_cluster::{Fault, Forwarder, Node};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};

use super::history::FaultWindow;

/// The faults a local run can inject, by their `--faults` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// `pg_wal_replay_pause()` on a replica, resumed at the end.
    Pause,
    /// A `recovery_min_apply_delay` spike (200–1000 ms) on a replica, with a reload.
    Delay,
    /// SIGSTOP of every process of a replica, SIGCONT at the end: a hung host.
    Stop,
    /// kill -9 of a replica, restarted at the end.
    Kill,
    /// 20–200 ms added each way between the proxy and a replica (fault forwarder).
    NetDelay,
    /// Nothing passes between the proxy and a replica; connections stay open (fault forwarder).
    Blackhole,
    /// kill -9 of the primary, restarted at the end (crash recovery; no failover).
    KillPrimary,
    /// A clean failover: the primary shut down, a replica promoted once it has every WAL record;
    /// at the end the old primary rejoins as a replica of the new one and the other replicas
    /// (orphaned meanwhile, on the old timeline) follow it too. The roles stay swapped.
    Failover,
}

pub const ALL: [FaultKind; 8] = [
    FaultKind::Pause,
    FaultKind::Delay,
    FaultKind::Stop,
    FaultKind::Kill,
    FaultKind::NetDelay,
    FaultKind::Blackhole,
    FaultKind::KillPrimary,
    FaultKind::Failover,
];

impl FaultKind {
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Pause => "pause",
            FaultKind::Delay => "delay",
            FaultKind::Stop => "stop",
            FaultKind::Kill => "kill",
            FaultKind::NetDelay => "net-delay",
            FaultKind::Blackhole => "blackhole",
            FaultKind::KillPrimary => "kill-primary",
            FaultKind::Failover => "failover",
        }
    }

    /// Whether the fault is made on the primary rather than on a replica.
    fn on_primary(self) -> bool {
        matches!(self, FaultKind::KillPrimary | FaultKind::Failover)
    }
}

impl FromStr for FaultKind {
    type Err = String;

    fn from_str(text: &str) -> Result<FaultKind, String> {
        let text = text.trim().to_ascii_lowercase();
        ALL.into_iter()
            .find(|kind| kind.name() == text)
            .ok_or_else(|| {
                let names: Vec<&str> = ALL.iter().map(|k| k.name()).collect();
                format!("unknown fault {text:?}: use {} or all", names.join(", "))
            })
    }
}

/// A `--faults` list (a type of its own so clap takes it as one value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultList(pub Vec<FaultKind>);

/// Parses a `--faults` list: names, `all`, or `none`.
pub fn parse_list(text: &str) -> Result<FaultList, String> {
    let mut kinds = Vec::new();
    for part in text.split(',').filter(|p| !p.trim().is_empty()) {
        match part.trim() {
            "none" => {}
            "all" => kinds.extend(ALL),
            name => kinds.push(name.parse()?),
        }
    }
    kinds.dedup();
    Ok(FaultList(kinds))
}

/// What the schedule acts on.
pub enum Targets {
    /// The local cluster lsngate started.
    Local(LocalTargets),
    /// Hosts the user controls, through their `--fault-hook` program.
    Hook(Hook),
}

/// The local cluster's primary, its replicas and, per server, the forwarder the proxy (or the
/// library) reaches it through. A failover swaps the roles here as it swaps them in the cluster.
pub struct LocalTargets {
    pub primary: Node,
    pub primary_forwarder: Arc<Forwarder>,
    pub replicas: Vec<Node>,
    pub forwarders: Vec<Arc<Forwarder>>,
    /// The apply delay the replicas run with outside a `delay` fault.
    pub baseline_delay: Duration,
}

/// A program run as `PROGRAM inject KIND` when a fault starts and `PROGRAM heal KIND` when it
/// ends, with the fault's particulars in its environment (`LSNGATE_FAULT`,
/// `LSNGATE_FAULT_ACTION`, `LSNGATE_FAULT_REPLICA`, `LSNGATE_FAULT_AMOUNT_MS`,
/// `LSNGATE_FAULT_SEED`). Exit status 0 means done; the first line it prints is recorded as the
/// fault's detail. Anything else, or no exit within [`HOOK_LIMIT`], stops the run.
pub struct Hook {
    pub program: PathBuf,
    /// How many replicas the deployment has (`LSNGATE_FAULT_REPLICA` is below it).
    pub replicas: usize,
    pub seed: u64,
}

/// How long a hook may take to inject or heal a fault.
pub const HOOK_LIMIT: Duration = Duration::from_secs(60);

impl Targets {
    /// How many replicas the schedule picks from.
    pub fn replica_count(&self) -> usize {
        match self {
            Targets::Local(local) => local.replicas.len(),
            Targets::Hook(hook) => hook.replicas,
        }
    }

    /// The name of the server a planned fault is made on, for the history.
    fn node_name(&self, planned: &Planned) -> String {
        match self {
            Targets::Local(local) => local.node(planned).name().into(),
            Targets::Hook(_) if planned.kind.on_primary() => "primary (hook)".into(),
            Targets::Hook(_) => format!("replica {} (hook)", planned.replica),
        }
    }

    fn inject(&mut self, planned: &Planned) -> anyhow::Result<String> {
        match self {
            Targets::Local(local) => local.inject(planned),
            Targets::Hook(hook) => hook.run("inject", planned),
        }
    }

    fn heal(&mut self, planned: &Planned) -> anyhow::Result<()> {
        match self {
            Targets::Local(local) => local.heal(planned),
            Targets::Hook(hook) => hook.run("heal", planned).map(drop),
        }
    }
}

/// One fault as planned: when, how long, where, how hard.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    pub kind: FaultKind,
    pub replica: usize,
    pub offset: Duration,
    pub hold: Duration,
    /// The delay or latency of `delay` / `net-delay`.
    pub amount: Duration,
}

/// The planned fault of each period, from the seed alone.
pub struct Schedule {
    rng: StdRng,
    kinds: Vec<FaultKind>,
    round: Vec<FaultKind>,
    replicas: usize,
    period: Duration,
}

impl Schedule {
    pub fn new(seed: u64, kinds: &[FaultKind], replicas: usize, period: Duration) -> Schedule {
        Schedule {
            rng: StdRng::seed_from_u64(seed),
            kinds: kinds.to_vec(),
            round: Vec::new(),
            replicas,
            period,
        }
    }

    /// The next period's fault (None when no kinds were requested).
    pub fn next_fault(&mut self) -> Option<Planned> {
        if self.kinds.is_empty() {
            return None;
        }
        if self.round.is_empty() {
            self.round = self.kinds.clone();
            self.round.shuffle(&mut self.rng);
            self.round.reverse();
        }
        let kind = self.round.pop()?;
        let period = self.period.as_secs_f64();
        let amount_ms = match kind {
            FaultKind::Delay => self.rng.random_range(200..=1000),
            FaultKind::NetDelay => self.rng.random_range(20..=200),
            _ => 0,
        };
        Some(Planned {
            kind,
            replica: self.rng.random_range(0..self.replicas.max(1)),
            offset: Duration::from_secs_f64(period * self.rng.random_range(0.10..0.30)),
            hold: Duration::from_secs_f64(period * self.rng.random_range(0.40..0.70)),
            amount: Duration::from_millis(amount_ms),
        })
    }
}

/// Runs the schedule until `stop` is set, setting `covered` once the first round (every
/// requested kind once) is over; every fault is healed before this returns. Blocking (the
/// cluster helpers run psql and pg_ctl): run it on a thread of its own.
pub fn run(
    mut schedule: Schedule,
    mut targets: Targets,
    start: Instant,
    stop: &AtomicBool,
    covered: &AtomicBool,
) -> anyhow::Result<Vec<FaultWindow>> {
    // Whatever happens here, the workload must not wait for a round that will not end.
    struct Covered<'a>(&'a AtomicBool);
    impl Drop for Covered<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let _covered_at_the_latest_on_return = Covered(covered);
    let mut windows = Vec::new();
    let ms = || start.elapsed().as_secs_f64() * 1e3;
    while let Some(planned) = schedule.next_fault() {
        let period_end = Instant::now() + schedule.period;
        if !sleep_unless_stopped(planned.offset, stop) {
            break;
        }
        let start_ms = ms();
        let node = targets.node_name(&planned);
        let detail = targets.inject(&planned)?;
        let held = sleep_unless_stopped(planned.hold, stop);
        targets.heal(&planned)?;
        windows.push(FaultWindow {
            kind: planned.kind.name().into(),
            node,
            detail,
            start_ms,
            end_ms: ms(),
        });
        if windows.len() >= schedule.kinds.len() {
            covered.store(true, Ordering::SeqCst);
        }
        if !held
            || !sleep_unless_stopped(period_end.saturating_duration_since(Instant::now()), stop)
        {
            break;
        }
    }
    Ok(windows)
}

/// Sleeps in small steps; false when `stop` was set meanwhile.
fn sleep_unless_stopped(total: Duration, stop: &AtomicBool) -> bool {
    let until = Instant::now() + total;
    while Instant::now() < until {
        if stop.load(Ordering::SeqCst) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10).min(until - Instant::now()));
    }
    !stop.load(Ordering::SeqCst)
}

impl LocalTargets {
    /// The server a planned fault is made on.
    fn node(&self, planned: &Planned) -> &Node {
        if planned.kind.on_primary() {
            &self.primary
        } else {
            &self.replicas[planned.replica]
        }
    }

    fn inject(&mut self, planned: &Planned) -> anyhow::Result<String> {
        let replica = self.replicas[planned.replica].clone();
        let forwarder = Arc::clone(&self.forwarders[planned.replica]);
        Ok(match planned.kind {
            FaultKind::Pause => {
                replica.pause_replay()?;
                "pg_wal_replay_pause()".into()
            }
            FaultKind::Delay => {
                replica.set_apply_delay(planned.amount)?;
                format!(
                    "recovery_min_apply_delay = {}ms",
                    planned.amount.as_millis()
                )
            }
            FaultKind::Stop => {
                replica.freeze();
                "SIGSTOP".into()
            }
            FaultKind::Kill => {
                replica.kill()?;
                "kill -9".into()
            }
            FaultKind::NetDelay => {
                forwarder.set_latency(planned.amount);
                format!(
                    "+{}ms each way, proxy to replica",
                    planned.amount.as_millis()
                )
            }
            FaultKind::Blackhole => {
                forwarder.set(Fault::Blackhole);
                "nothing passes, proxy to replica".into()
            }
            FaultKind::KillPrimary => {
                self.primary.kill()?;
                "kill -9 of the primary".into()
            }
            FaultKind::Failover => {
                let (old, new) = (self.primary.name().to_string(), replica.name().to_string());
                self.primary.hand_over_to(&replica)?;
                // The promoted replica is the primary from now on; the old one is down until
                // the fault heals.
                std::mem::swap(&mut self.primary, &mut self.replicas[planned.replica]);
                std::mem::swap(
                    &mut self.primary_forwarder,
                    &mut self.forwarders[planned.replica],
                );
                format!("{old} shut down, {new} promoted")
            }
        })
    }

    fn heal(&mut self, planned: &Planned) -> anyhow::Result<()> {
        let replica = &self.replicas[planned.replica];
        let forwarder = &self.forwarders[planned.replica];
        match planned.kind {
            FaultKind::Pause => replica.resume_replay()?,
            FaultKind::Delay => replica.set_apply_delay(self.baseline_delay)?,
            FaultKind::Stop => replica.thaw(),
            FaultKind::Kill => replica.start()?,
            FaultKind::NetDelay | FaultKind::Blackhole => forwarder.set(Fault::None),
            FaultKind::KillPrimary => self.primary.start()?,
            // Every replica follows the new primary: the old primary (index `planned.replica`
            // since the swap) starts as one, the others are repointed.
            FaultKind::Failover => {
                for replica in &self.replicas {
                    replica.follow(&self.primary)?;
                }
            }
        }
        Ok(())
    }
}

impl Hook {
    /// Runs the hook for `action` (`inject` or `heal`) of `planned`; the first line it printed.
    fn run(&self, action: &str, planned: &Planned) -> anyhow::Result<String> {
        let kind = planned.kind.name();
        let shown = format!("{} {action} {kind}", self.program.display());
        let mut child = Command::new(&self.program)
            .args([action, kind])
            .env("LSNGATE_FAULT", kind)
            .env("LSNGATE_FAULT_ACTION", action)
            .env("LSNGATE_FAULT_REPLICA", planned.replica.to_string())
            .env(
                "LSNGATE_FAULT_AMOUNT_MS",
                planned.amount.as_millis().to_string(),
            )
            .env("LSNGATE_FAULT_SEED", self.seed.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                anyhow::anyhow!(
                    "cannot run the fault hook `{shown}`: {e}; is --fault-hook an executable file?"
                )
            })?;
        let until = Instant::now() + HOOK_LIMIT;
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if Instant::now() >= until {
                let _ = child.kill();
                let _ = child.wait();
                anyhow::bail!(
                    "the fault hook `{shown}` did not exit within {HOOK_LIMIT:?}; it was killed and the run stopped"
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let output = child.wait_with_output()?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        anyhow::ensure!(
            status.success(),
            "the fault hook `{shown}` failed ({status}): {}; the run stopped (faults it injected may still be in place)",
            String::from_utf8_lossy(&output.stderr).trim()
        );
        Ok(stdout
            .lines()
            .next()
            .map_or_else(|| format!("hook {action} {kind}"), str::to_string))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_round_holds_every_kind_once_and_a_seed_replays_the_schedule() {
        let plan = |seed| {
            let mut schedule = Schedule::new(seed, &ALL, 2, Duration::from_secs(1));
            (0..2 * ALL.len())
                .map(|_| schedule.next_fault().unwrap())
                .collect::<Vec<_>>()
        };
        let faults = plan(7);
        for round in faults.chunks(ALL.len()) {
            let mut kinds: Vec<&str> = round.iter().map(|p| p.kind.name()).collect();
            kinds.sort();
            let mut all: Vec<&str> = ALL.iter().map(|k| k.name()).collect();
            all.sort();
            assert_eq!(kinds, all);
        }
        for p in &faults {
            assert!(p.replica < 2);
            assert!(p.offset + p.hold < Duration::from_secs(1));
        }
        assert_eq!(faults, plan(7));
        assert_ne!(faults, plan(8));
    }

    #[test]
    fn fault_lists_parse_by_name_and_name_what_is_accepted() {
        assert_eq!(
            parse_list("pause,kill").unwrap().0,
            vec![FaultKind::Pause, FaultKind::Kill]
        );
        assert_eq!(parse_list("all").unwrap().0, ALL.to_vec());
        assert_eq!(parse_list("none").unwrap().0, vec![]);
        assert_eq!(
            parse_list("kill-primary,failover").unwrap().0,
            vec![FaultKind::KillPrimary, FaultKind::Failover]
        );
        let err = parse_list("pause,reboot").unwrap_err();
        assert!(
            err.contains("\"reboot\"") && err.contains("kill-primary") && err.contains("failover"),
            "{err}"
        );
    }
}
