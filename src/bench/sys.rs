//! Process-level measurements: CPU time and context switches (getrusage, which also counts
//! threads that already exited), per-thread wake-ups from `/proc/self/task`, and resident memory.

use std::time::Instant;

/// CPU time and context switches of the whole process at one instant.
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct CpuSnap {
    /// User + system CPU time, microseconds.
    pub cpu_us: f64,
    /// Voluntary + involuntary context switches (each a thread going to sleep or being
    /// preempted, so about one per wake-up).
    pub ctxsw: f64,
    pub at: Instant,
}

/// Take a snapshot with `getrusage(RUSAGE_SELF)`.
pub fn cpu_snap() -> CpuSnap {
    // SAFETY: getrusage writes into the zeroed struct we own; RUSAGE_SELF is always valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    CpuSnap {
        cpu_us: tv(ru.ru_utime) + tv(ru.ru_stime),
        ctxsw: (ru.ru_nvcsw + ru.ru_nivcsw) as f64,
        at: Instant::now(),
    }
}

/// Context switches per live thread: (thread id, name, switches).
pub fn thread_switches() -> Vec<(u32, String, u64)> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc/self/task") else { return out };
    for e in rd.flatten() {
        let Ok(tid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(status) = std::fs::read_to_string(e.path().join("status")) else { continue };
        let mut name = String::new();
        let mut n = 0u64;
        for line in status.lines() {
            if let Some(v) = line.strip_prefix("Name:") {
                name = v.trim().to_string();
            } else if line.starts_with("voluntary_ctxt_switches") || line.starts_with("nonvoluntary_ctxt_switches") {
                n += line.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            }
        }
        out.push((tid, name, n));
    }
    out
}

/// Per-thread switch deltas between two [`thread_switches`] readings, threads that changed
/// only, as "name(tid)=delta" (threads that exited in between are marked "exited").
pub fn thread_deltas(before: &[(u32, String, u64)], after: &[(u32, String, u64)]) -> Vec<String> {
    let mut out = Vec::new();
    for (tid, name, n) in after {
        let old = before.iter().find(|b| b.0 == *tid).map(|b| b.2).unwrap_or(0);
        if *n > old {
            out.push(format!("{name}({tid})=+{}", n - old));
        }
    }
    for (tid, name, _) in before {
        if !after.iter().any(|a| a.0 == *tid) {
            out.push(format!("{name}({tid})=exited"));
        }
    }
    out
}

/// Resident set size of this process in MB (VmRSS from `/proc/self/status`).
pub fn rss_mb() -> Option<f64> {
    rss_mb_of("/proc/self/status")
}

/// Resident set size in MB from a `/proc/<pid>/status` file.
pub fn rss_mb_of(status_file: &str) -> Option<f64> {
    let s = std::fs::read_to_string(status_file).ok()?;
    let kb: f64 = s.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.split_whitespace().next()?.parse().ok()?;
    Some(kb / 1024.0)
}

/// Peak resident set size in MB (VmHWM) from a `/proc/<pid>/status` file.
pub fn peak_rss_mb_of(status_file: &str) -> Option<f64> {
    let s = std::fs::read_to_string(status_file).ok()?;
    let kb: f64 = s.lines().find_map(|l| l.strip_prefix("VmHWM:"))?.split_whitespace().next()?.parse().ok()?;
    Some(kb / 1024.0)
}

/// The machine: logical CPUs, CPU model, kernel, and the filesystem holding `dir`.
pub fn machine(dir: &std::path::Path) -> super::Machine {
    let nproc = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name").map(|v| v.trim_start_matches([' ', '\t', ':']).to_string()))
        })
        .unwrap_or_else(|| "unknown".into());
    let kernel =
        std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).unwrap_or_default();
    super::Machine { nproc, cpu, kernel, fs: filesystem(dir).unwrap_or_else(|| "unknown".into()) }
}

/// The device and type of the mount that holds `dir` (longest matching mount point).
fn filesystem(dir: &std::path::Path) -> Option<String> {
    let dir = std::fs::canonicalize(dir).ok()?;
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (dev, mnt, ty) = (f.next()?, f.next()?, f.next()?);
            dir.starts_with(mnt).then(|| (mnt.len(), format!("{dev} {ty}")))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, s)| s)
}

/// The value at quantile `p` (0..=1) of sorted samples (nearest rank, like the peers).
pub fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// xorshift64: a deterministic pseudo-random value in `0..max` (gaps between tasks).
pub fn jitter(state: &mut u64, max: u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state % max.max(1)
}
