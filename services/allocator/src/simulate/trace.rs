//! Job traces: the in-memory form and the CSV format (see the module docs of
//! [`crate::simulate`] for the columns).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{BufRead, Write};

use anyhow::{Context as _, bail};
use runyard_store::workload;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::model::Workload;

/// One job of a trace (its first attempt's facts; retries are simulated).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Job {
    /// When the job ran, unix seconds.
    pub at: f64,
    /// Index into [`Trace::workloads`].
    pub workload: u32,
    /// Index into [`Trace::refs`].
    pub git_ref: u32,
    /// The memory the job needs (its peak when it is not killed).
    pub peak_memory_bytes: u64,
    /// CPU seconds used.
    pub cpu_seconds: f64,
    /// Wall-clock seconds.
    pub wall_seconds: f64,
}

/// A trace: jobs in time order with interned workloads and refs.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    /// Distinct workloads (by normalized key).
    pub workloads: Vec<Workload>,
    /// Distinct refs.
    pub refs: Vec<String>,
    /// Jobs sorted by time.
    pub jobs: Vec<Job>,
}

/// Interns workloads and refs while a trace is built.
#[derive(Debug, Default)]
pub struct TraceBuilder {
    trace: Trace,
    workload_ids: HashMap<String, u32>,
    ref_ids: HashMap<String, u32>,
}

impl TraceBuilder {
    /// The index of `workload`, added when new.
    pub fn workload(&mut self, workload: Workload) -> u32 {
        let key = workload::key(workload.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        if let Some(&id) = self.workload_ids.get(&key) {
            return id;
        }
        let id = u32::try_from(self.trace.workloads.len()).unwrap_or(u32::MAX);
        self.trace.workloads.push(workload);
        self.workload_ids.insert(key, id);
        id
    }

    /// The index of `git_ref`, added when new.
    pub fn git_ref(&mut self, git_ref: &str) -> u32 {
        if let Some(&id) = self.ref_ids.get(git_ref) {
            return id;
        }
        let id = u32::try_from(self.trace.refs.len()).unwrap_or(u32::MAX);
        self.trace.refs.push(git_ref.to_owned());
        self.ref_ids.insert(git_ref.to_owned(), id);
        id
    }

    /// Adds a job.
    pub fn push(&mut self, job: Job) {
        self.trace.jobs.push(job);
    }

    /// The trace, jobs sorted by time (stable: equal times keep file order).
    pub fn finish(mut self) -> Trace {
        self.trace.jobs.sort_by(|a, b| a.at.total_cmp(&b.at));
        self.trace
    }
}

/// Splits one CSV record (RFC 4180 quoting; no newlines inside fields).
fn split_csv(line: &str) -> anyhow::Result<Vec<String>> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    let mut at_start = true;
    while let Some(c) = chars.next() {
        if quoted {
            if c == '"' {
                if chars.peek() == Some(&'"') {
                    chars.next();
                    field.push('"');
                } else {
                    quoted = false;
                }
            } else {
                field.push(c);
            }
        } else if c == '"' && at_start {
            quoted = true;
            at_start = false;
        } else if c == ',' {
            fields.push(std::mem::take(&mut field));
            at_start = true;
        } else {
            field.push(c);
            at_start = false;
        }
    }
    if quoted {
        bail!("unterminated quoted field");
    }
    fields.push(field);
    Ok(fields)
}

fn quote(field: &str) -> String {
    if field.contains([',', '"', '\n']) {
        format!("\"{}\"", field.replace('"', "\"\""))
    } else {
        field.to_owned()
    }
}

fn parse_time(s: &str) -> anyhow::Result<f64> {
    if let Some(t) = s.parse::<f64>().ok().filter(|t| t.is_finite()) {
        return Ok(t);
    }
    let t = OffsetDateTime::parse(s, &Rfc3339).with_context(|| format!("invalid time {s:?}"))?;
    Ok(t.unix_timestamp_nanos() as f64 / 1e9)
}

fn parse_seconds(s: &str, what: &str) -> anyhow::Result<f64> {
    if s.is_empty() {
        return Ok(f64::NAN);
    }
    let v: f64 = s.parse().with_context(|| format!("invalid {what} {s:?}"))?;
    if !(v.is_finite() && v >= 0.0) {
        bail!("invalid {what} {s:?}");
    }
    Ok(v)
}

/// The columns a trace file must or may have besides workload attributes.
const TIME: &str = "time";
const REF: &str = "ref";
const PEAK: &str = "peak_memory_bytes";
const CPU: &str = "cpu_seconds";
const WALL: &str = "wall_seconds";
const WORKLOAD: &str = "workload";

/// Reads a CSV trace.
pub fn read_csv(reader: impl BufRead) -> anyhow::Result<Trace> {
    let mut lines = reader.lines().enumerate();
    let header = loop {
        match lines.next() {
            Some((_, line)) => {
                let line = line.context("reading header")?;
                if !line.trim().is_empty() {
                    break split_csv(line.trim_end_matches('\r'))?;
                }
            }
            None => bail!("empty trace"),
        }
    };
    let header: Vec<String> = header.iter().map(|h| h.trim().to_owned()).collect();
    let column = |name: &str| header.iter().position(|h| h == name);
    let time = column(TIME).context("missing column `time`")?;
    let peak = column(PEAK).context("missing column `peak_memory_bytes`")?;
    let git_ref = column(REF).context("missing column `ref`")?;
    let cpu = column(CPU);
    let wall = column(WALL);
    let workload_col = column(WORKLOAD);
    let attributes: Vec<(usize, &str)> = header
        .iter()
        .enumerate()
        .filter(|(_, h)| ![TIME, REF, PEAK, CPU, WALL, WORKLOAD].contains(&h.as_str()))
        .map(|(i, h)| (i, h.as_str()))
        .collect();
    if workload_col.is_none() && attributes.is_empty() {
        bail!("no workload columns (a `workload` column or attribute columns)");
    }

    let mut builder = TraceBuilder::default();
    for (number, line) in lines {
        let line = line.with_context(|| format!("reading line {}", number + 1))?;
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        let record = || -> anyhow::Result<(Workload, String, Job)> {
            let fields = split_csv(line)?;
            if fields.len() != header.len() {
                bail!("{} fields, header has {}", fields.len(), header.len());
            }
            let get = |i: usize| fields[i].trim();
            let mut workload = Workload::new();
            if let Some(i) = workload_col {
                for pair in get(i).split(';').filter(|p| !p.trim().is_empty()) {
                    let (k, v) = pair
                        .split_once('=')
                        .with_context(|| format!("workload part {pair:?} is not k=v"))?;
                    if !v.trim().is_empty() {
                        workload.insert(k.trim().to_owned(), v.trim().to_owned());
                    }
                }
            }
            for &(i, name) in &attributes {
                if !get(i).is_empty() {
                    workload.insert(name.to_owned(), get(i).to_owned());
                }
            }
            crate::model::validate(&workload).map_err(anyhow::Error::msg)?;
            let peak: u64 = get(peak)
                .parse::<f64>()
                .ok()
                .filter(|p| p.is_finite() && *p >= 0.0)
                .map(|p| p as u64)
                .with_context(|| format!("invalid peak_memory_bytes {:?}", get(peak)))?;
            let job = Job {
                at: parse_time(get(time))?,
                workload: 0,
                git_ref: 0,
                peak_memory_bytes: peak,
                cpu_seconds: cpu.map_or(Ok(f64::NAN), |i| parse_seconds(get(i), CPU))?,
                wall_seconds: wall.map_or(Ok(f64::NAN), |i| parse_seconds(get(i), WALL))?,
            };
            Ok((workload, get(git_ref).to_owned(), job))
        };
        let (workload, git_ref, mut job) =
            record().with_context(|| format!("line {}", number + 1))?;
        job.workload = builder.workload(workload);
        job.git_ref = builder.git_ref(&git_ref);
        builder.push(job);
    }
    Ok(builder.finish())
}

/// The Spack attribute columns written by [`write_csv`], in order; other
/// attributes go into a `workload` column.
const SPACK_COLUMNS: [&str; 6] = [
    "package",
    "version",
    "variants",
    "compiler",
    "compiler_version",
    "arch",
];

/// Writes a trace as CSV: `time,package,version,variants,compiler,
/// compiler_version,arch,workload,ref,peak_memory_bytes,cpu_seconds,wall_seconds`
/// where `workload` holds any other attributes as `k=v;k=v`.
pub fn write_csv(trace: &Trace, mut out: impl Write) -> anyhow::Result<()> {
    writeln!(
        out,
        "{TIME},{},{WORKLOAD},{REF},{PEAK},{CPU},{WALL}",
        SPACK_COLUMNS.join(",")
    )?;
    let mut line = String::new();
    for job in &trace.jobs {
        let workload = &trace.workloads[job.workload as usize];
        line.clear();
        let _ = write!(line, "{}", job.at);
        for column in SPACK_COLUMNS {
            line.push(',');
            line.push_str(&quote(workload.get(column).map_or("", String::as_str)));
        }
        let others: Vec<String> = workload
            .iter()
            .filter(|(k, _)| !SPACK_COLUMNS.contains(&k.as_str()))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        line.push(',');
        line.push_str(&quote(&others.join(";")));
        line.push(',');
        line.push_str(&quote(&trace.refs[job.git_ref as usize]));
        let seconds = |s: f64| {
            if s.is_finite() {
                format!("{s:.1}")
            } else {
                String::new()
            }
        };
        let _ = write!(
            line,
            ",{},{},{}",
            job.peak_memory_bytes,
            seconds(job.cpu_seconds),
            seconds(job.wall_seconds)
        );
        writeln!(out, "{line}")?;
    }
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_round_trip_keeps_jobs_and_quoting() {
        let text = "time,package,version,variants,compiler,compiler_version,arch,workload,ref,peak_memory_bytes,cpu_seconds,wall_seconds\n\
            300,zlib,1.3,\"+shared cflags=-O2,-g\",gcc,12.3.0,x86_64,,develop,1000000,10,5\n\
            200,zlib,1.3,\"cflags=-O2,-g +shared\",gcc,12.3.0,x86_64,,develop,1500000,10,5\n\
            100,zlib,1.3,+shared,gcc,12.3.0,x86_64,stack=e4s,pr-1,2000000,,\n";
        let trace = read_csv(text.as_bytes()).unwrap();
        assert_eq!(trace.jobs.len(), 3);
        // Sorted by time; the variants' order does not make another workload,
        // the extra `stack` attribute does.
        assert_eq!(trace.jobs[0].at, 100.0);
        assert_eq!(trace.workloads.len(), 2);
        assert_eq!(trace.jobs[1].workload, trace.jobs[2].workload);
        assert_eq!(
            trace.workloads[trace.jobs[0].workload as usize]["stack"],
            "e4s"
        );
        assert!(trace.jobs[0].cpu_seconds.is_nan());
        let mut out = Vec::new();
        write_csv(&trace, &mut out).unwrap();
        let again = read_csv(out.as_slice()).unwrap();
        let facts = |t: &Trace| -> Vec<(u64, Workload, String, u64)> {
            t.jobs
                .iter()
                .map(|j| {
                    (
                        j.at as u64,
                        t.workloads[j.workload as usize].clone(),
                        t.refs[j.git_ref as usize].clone(),
                        j.peak_memory_bytes,
                    )
                })
                .collect()
        };
        assert_eq!(facts(&again), facts(&trace));
    }

    #[test]
    fn csv_errors_name_the_line() {
        let text = "time,package,ref,peak_memory_bytes\n1,zlib,develop,lots\n";
        let err = format!("{:#}", read_csv(text.as_bytes()).unwrap_err());
        assert!(err.contains("line 2"), "{err}");
        assert!(err.contains("peak_memory_bytes"), "{err}");
        let err = format!("{:#}", read_csv("package,ref\n".as_bytes()).unwrap_err());
        assert!(err.contains("time"), "{err}");
    }

    #[test]
    fn times_may_be_rfc3339() {
        let text =
            "time,workload,ref,peak_memory_bytes\n2025-01-01T00:00:10Z,repo=a;job=b,main,5\n";
        let trace = read_csv(text.as_bytes()).unwrap();
        assert_eq!(trace.jobs[0].at, 1_735_689_610.0);
        assert_eq!(trace.workloads[0]["repo"], "a");
    }
}
