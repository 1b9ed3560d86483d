//! Metrics exposition: Prometheus' classic text format (0.0.4) by default,
//! OpenMetrics 1.0 text when the scraper's `Accept` asks for it, the way
//! Prometheus' own client libraries negotiate.
//!
//! A small writer rather than the `prometheus-client` crate: that crate
//! writes OpenMetrics only, which `promtool check metrics` and older
//! scrapers cannot read. Both formats differ in little (the counter's
//! family name, HELP escaping, the `# EOF` line); the writer keeps one
//! family per name and refuses a second one of the same name.
//!
//! Also here: the standard `process_*` metrics of this process, read from
//! `/proc/self`, and the `*_build_info` gauge, for both HTTP servers.

use std::collections::HashSet;
use std::fmt::Write as _;

/// The classic text format's content type.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// OpenMetrics' content type.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// An exposition format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Prometheus' text format 0.0.4.
    Text,
    /// OpenMetrics 1.0 text.
    OpenMetrics,
}

impl Format {
    /// OpenMetrics when `Accept` names `application/openmetrics-text` with a
    /// quality above zero and at least that of every other range it names;
    /// the classic text format otherwise (no header, `*/*`, `text/plain`).
    pub fn negotiate(accept: Option<&str>) -> Format {
        let Some(accept) = accept else {
            return Format::Text;
        };
        let mut om = 0.0f32;
        let mut other = 0.0f32;
        for range in accept.split(',') {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let mut q = 1.0f32;
            for p in parts {
                if let Some((k, v)) = p.split_once('=') {
                    if k.trim().eq_ignore_ascii_case("q") {
                        q = v.trim().parse().unwrap_or(0.0);
                    }
                }
            }
            if media == "application/openmetrics-text" {
                om = om.max(q);
            } else if !media.is_empty() {
                other = other.max(q);
            }
        }
        if om > 0.0 && om >= other {
            Format::OpenMetrics
        } else {
            Format::Text
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => TEXT_CONTENT_TYPE,
            Format::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
        }
    }
}

/// A sample's value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    Int(u64),
    Float(f64),
}

impl From<u64> for Value {
    fn from(v: u64) -> Value {
        Value::Int(v)
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::Float(v)
    }
}

fn write_f64(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v == f64::INFINITY {
        out.push_str("+Inf");
    } else if v == f64::NEG_INFINITY {
        out.push_str("-Inf");
    } else {
        // Debug keeps a decimal point ("1.0") or an exponent ("2.5e-5"):
        // both formats read either, and OpenMetrics wants `le` as a float.
        let _ = write!(out, "{v:?}");
    }
}

fn write_value(out: &mut String, v: Value) {
    match v {
        Value::Int(i) => {
            let _ = write!(out, "{i}");
        }
        Value::Float(f) => write_f64(out, f),
    }
}

/// A label value: backslash, double quote and newline escaped (both formats).
fn write_label_value(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// A metric family's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// One scrape being written.
#[derive(Debug)]
pub struct Exposition {
    format: Format,
    out: String,
    names: HashSet<String>,
}

impl Exposition {
    pub fn new(format: Format) -> Exposition {
        Exposition {
            format,
            out: String::new(),
            names: HashSet::new(),
        }
    }

    pub fn format(&self) -> Format {
        self.format
    }

    /// A counter family. `name` is given without `_total`; every sample
    /// gets it.
    ///
    /// # Panics
    /// On a name that is not a metric name, that ends in `_total`, or whose
    /// family was written already: a bug in the caller, which a test of it
    /// finds.
    pub fn counter(&mut self, name: &str, help: &str) -> Family<'_> {
        assert!(
            !name.ends_with("_total"),
            "counter {name}: give the name without _total"
        );
        self.family(name, Kind::Counter, help)
    }

    /// A gauge family (panics like [`Exposition::counter`]).
    pub fn gauge(&mut self, name: &str, help: &str) -> Family<'_> {
        self.family(name, Kind::Gauge, help)
    }

    /// A histogram family (panics like [`Exposition::counter`]).
    pub fn histogram(&mut self, name: &str, help: &str) -> Family<'_> {
        self.family(name, Kind::Histogram, help)
    }

    fn family(&mut self, name: &str, kind: Kind, help: &str) -> Family<'_> {
        assert!(valid_name(name), "{name:?} is not a metric name");
        assert!(
            self.names.insert(name.to_string()),
            "metric family {name} written twice"
        );
        // The classic format names a counter family by its samples' name.
        let family_name = match (kind, self.format) {
            (Kind::Counter, Format::Text) => format!("{name}_total"),
            _ => name.to_string(),
        };
        let out = &mut self.out;
        let _ = write!(out, "# HELP {family_name} ");
        for c in help.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '"' if self.format == Format::OpenMetrics => out.push_str("\\\""),
                c => out.push(c),
            }
        }
        let t = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let _ = writeln!(out, "\n# TYPE {family_name} {t}");
        Family {
            out,
            name: name.to_string(),
            kind,
        }
    }

    /// The scrape's text.
    pub fn finish(mut self) -> String {
        if self.format == Format::OpenMetrics {
            self.out.push_str("# EOF\n");
        }
        self.out
    }
}

/// One family's samples.
#[derive(Debug)]
pub struct Family<'a> {
    out: &'a mut String,
    name: String,
    kind: Kind,
}

impl Family<'_> {
    fn line(&mut self, suffix: &str, labels: &[(&str, &str)], extra: Option<(&str, &str)>, v: Value) {
        let out = &mut *self.out;
        out.push_str(&self.name);
        out.push_str(suffix);
        let all = labels.iter().copied().chain(extra);
        let mut first = true;
        for (k, val) in all {
            debug_assert!(valid_name(k) && !k.contains(':'), "{k:?} is not a label name");
            out.push(if first { '{' } else { ',' });
            first = false;
            out.push_str(k);
            out.push_str("=\"");
            write_label_value(out, val);
            out.push('"');
        }
        if !first {
            out.push('}');
        }
        out.push(' ');
        write_value(out, v);
        out.push('\n');
    }

    /// One sample of a counter or gauge.
    ///
    /// # Panics
    /// On a histogram family (use [`Family::histogram`]).
    pub fn sample(&mut self, labels: &[(&str, &str)], v: impl Into<Value>) {
        match self.kind {
            Kind::Counter => self.line("_total", labels, None, v.into()),
            Kind::Gauge => self.line("", labels, None, v.into()),
            Kind::Histogram => panic!("{}: a histogram takes histogram samples", self.name),
        }
    }

    /// One histogram: cumulative `_bucket`s, `_sum`, `_count`.
    ///
    /// # Panics
    /// On a counter or gauge family.
    pub fn histogram(&mut self, labels: &[(&str, &str)], h: &Histogram) {
        assert_eq!(self.kind, Kind::Histogram, "{}: not a histogram", self.name);
        let mut cumulative = 0u64;
        let mut le = String::new();
        for (i, n) in h.counts.iter().enumerate() {
            cumulative += n;
            le.clear();
            write_f64(&mut le, h.bounds.get(i).copied().unwrap_or(f64::INFINITY));
            self.line("_bucket", labels, Some(("le", &le)), Value::Int(cumulative));
        }
        self.line("_sum", labels, None, Value::Float(h.sum));
        self.line("_count", labels, None, Value::Int(cumulative));
    }
}

/// A histogram read at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    /// Upper bounds of the finite buckets, ascending.
    pub bounds: &'static [f64],
    /// Observations per bucket (not cumulative), one more than `bounds`:
    /// the last is the `+Inf` bucket's own.
    pub counts: Vec<u64>,
    /// Sum of the observations.
    pub sum: f64,
}

impl Histogram {
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Adds another histogram of the same buckets.
    pub fn add(&mut self, o: &Histogram) {
        debug_assert_eq!(self.bounds, o.bounds);
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
        self.sum += o.sum;
    }
}

/// `{prefix}_build_info{version,...} 1`: the version and any constant
/// facts (which fan-out backend) as labels of one series.
pub fn build_info(e: &mut Exposition, prefix: &str, labels: &[(&str, &str)]) {
    let mut all = vec![("version", env!("CARGO_PKG_VERSION"))];
    all.extend_from_slice(labels);
    e.gauge(
        &format!("{prefix}_build_info"),
        "Always 1; the labels name the version and build-time or start-up facts.",
    )
    .sample(&all, 1u64);
}

/// An HTTP server's [`crate::Stats`] as `{prefix}_http_*_total` counters.
pub fn http_stats(e: &mut Exposition, prefix: &str, s: &crate::Stats) {
    for (name, help, v) in [
        ("requests", "Requests answered by the handler.", s.requests),
        ("connections", "Connections accepted.", s.connections),
        (
            "over_cap_connections",
            "Connections closed at once because the connection cap was reached.",
            s.over_cap,
        ),
        (
            "idle_closed_connections",
            "Connections closed after the idle timeout without traffic.",
            s.idle_closed,
        ),
        (
            "body_refused_requests",
            "Requests refused for their body (413).",
            s.body_refused,
        ),
        ("h2_refused_connections", "HTTP/2 prefaces answered 505.", s.h2_refused),
        (
            "tls_failed_connections",
            "TLS handshakes that failed or took longer than the header timeout.",
            s.tls_failed,
        ),
    ] {
        e.counter(&format!("{prefix}_http_{name}"), help).sample(&[], v);
    }
}

/// This process's resources from `/proc/self`, named as Prometheus' client
/// libraries name them. A file that cannot be read leaves its metric out
/// (and says so in the log) rather than failing the scrape.
pub fn process(e: &mut Exposition) {
    let tps = oskit::procfs::ticks_per_second() as f64;
    let stat = std::fs::read_to_string("/proc/self/stat");
    if let Ok(stat) = &stat {
        if let Some(t) = oskit::procfs::parse_pid_stat(stat) {
            e.counter(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
            )
            .sample(&[], t.total() as f64 / tps);
        }
    }
    match std::fs::read_to_string("/proc/self/status")
        .ok()
        .as_deref()
        .and_then(parse_vm_rss_bytes)
    {
        Some(rss) => e
            .gauge("process_resident_memory_bytes", "Resident memory size in bytes.")
            .sample(&[], rss),
        None => tracing::debug!("no VmRSS in /proc/self/status"),
    }
    if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
        // The directory's own descriptor, open while it is listed, is not counted.
        let n = dir.count().saturating_sub(1) as u64;
        e.gauge("process_open_fds", "Number of open file descriptors.")
            .sample(&[], n);
    }
    if let Some(max) = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .as_deref()
        .and_then(parse_max_open_files)
    {
        e.gauge("process_max_fds", "Maximum number of open file descriptors.")
            .sample(&[], max);
    }
    let start = stat.ok().as_deref().and_then(oskit::procfs::parse_start_time);
    let btime = std::fs::read_to_string("/proc/stat")
        .ok()
        .as_deref()
        .and_then(parse_btime);
    if let (Some(start), Some(btime)) = (start, btime) {
        e.gauge(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
        )
        .sample(&[], btime as f64 + start as f64 / tps);
    }
}

/// `VmRSS:  1234 kB` from `/proc/<pid>/status`, in bytes.
pub fn parse_vm_rss_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let mut it = line["VmRSS:".len()..].split_ascii_whitespace();
    let n: u64 = it.next()?.parse().ok()?;
    (it.next()? == "kB").then_some(n * 1024)
}

/// The soft limit of `Max open files` from `/proc/<pid>/limits`.
pub fn parse_max_open_files(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line["Max open files".len()..].split_ascii_whitespace().next()?;
    soft.parse().ok()
}

/// `btime` (boot time, unix seconds) from `/proc/stat`.
pub fn parse_btime(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_follows_accept() {
        assert_eq!(Format::negotiate(None), Format::Text);
        assert_eq!(Format::negotiate(Some("*/*")), Format::Text);
        assert_eq!(Format::negotiate(Some("text/plain;version=0.0.4")), Format::Text);
        // What Prometheus 2.x sends.
        let prom = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::negotiate(Some(prom)), Format::OpenMetrics);
        assert_eq!(
            Format::negotiate(Some(
                "text/plain;version=0.0.4;q=0.9,application/openmetrics-text;q=0.5"
            )),
            Format::Text
        );
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text;q=0")),
            Format::Text
        );
    }

    #[test]
    fn both_formats() {
        for format in [Format::Text, Format::OpenMetrics] {
            let mut e = Exposition::new(format);
            e.counter("x_bytes", "Bytes \"in\"\\out\nsecond line.")
                .sample(&[("group", "a\"b\\c\nd")], 5u64);
            e.gauge("y", "Y.").sample(&[], 0.25);
            let h = Histogram {
                bounds: &[0.001, 1.0],
                counts: vec![1, 2, 3],
                sum: 7.5,
            };
            e.histogram("z_seconds", "Z.").histogram(&[("g", "1")], &h);
            let t = e.finish();
            let (tname, help) = match format {
                Format::Text => ("x_bytes_total", "Bytes \"in\"\\\\out\\nsecond line."),
                Format::OpenMetrics => ("x_bytes", "Bytes \\\"in\\\"\\\\out\\nsecond line."),
            };
            assert!(t.contains(&format!("# TYPE {tname} counter\n")), "{t}");
            assert!(t.contains(&format!("# HELP {tname} {help}\n")), "{t}");
            assert!(t.contains("x_bytes_total{group=\"a\\\"b\\\\c\\nd\"} 5\n"), "{t}");
            assert!(t.contains("y 0.25\n"), "{t}");
            assert!(t.contains("z_seconds_bucket{g=\"1\",le=\"0.001\"} 1\n"), "{t}");
            assert!(t.contains("z_seconds_bucket{g=\"1\",le=\"1.0\"} 3\n"), "{t}");
            assert!(t.contains("z_seconds_bucket{g=\"1\",le=\"+Inf\"} 6\n"), "{t}");
            assert!(t.contains("z_seconds_sum{g=\"1\"} 7.5\n"), "{t}");
            assert!(t.contains("z_seconds_count{g=\"1\"} 6\n"), "{t}");
            assert_eq!(t.ends_with("# EOF\n"), format == Format::OpenMetrics);
        }
    }

    #[test]
    #[should_panic(expected = "written twice")]
    fn one_family_per_name() {
        let mut e = Exposition::new(Format::Text);
        e.gauge("a", "A.").sample(&[], 1u64);
        e.gauge("a", "A.").sample(&[("g", "1")], 1u64);
    }

    #[test]
    fn process_metrics_of_this_process() {
        let mut e = Exposition::new(Format::Text);
        process(&mut e);
        let t = e.finish();
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_max_fds ",
            "process_start_time_seconds ",
        ] {
            assert!(t.contains(name), "{name} missing:\n{t}");
        }
        let start: f64 = t
            .lines()
            .find_map(|l| l.strip_prefix("process_start_time_seconds "))
            .unwrap()
            .parse()
            .unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(start > now - 86_400.0 * 365.0 && start <= now + 1.0, "{start} vs {now}");
        assert_eq!(parse_vm_rss_bytes("Name: x\nVmRSS:\t  1200 kB\n"), Some(1200 * 1024));
        assert_eq!(
            parse_max_open_files(
                "Limit Soft Hard Units\nMax open files            1024                 524288               files\n"
            ),
            Some(1024)
        );
        assert_eq!(parse_btime("cpu 1 2\nbtime 1700000000\n"), Some(1_700_000_000));
    }
}
