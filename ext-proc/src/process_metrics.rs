//! The standard `process_*` metrics (the names every Prometheus client library exports, so
//! stock dashboards and alerts work) read from `/proc/self` at scrape time, and
//! `kvroute_build_info{version}`. On systems without `/proc` only the build info is exported.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// Reads the process's own figures at each scrape.
#[derive(Debug)]
struct ProcessCollector;

fn gauge(enc: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: f64) -> std::fmt::Result {
    let m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    ConstGauge::new(v).encode(m)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> std::fmt::Result {
        let version = [("version", env!("CARGO_PKG_VERSION"))];
        let mut m = enc.encode_descriptor(
            "kvroute_build_info",
            "kvroute-ext-proc's version (always 1)",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(1i64).encode(m.encode_family(&version)?)?;
        #[cfg(target_os = "linux")]
        if let Some(p) = linux::read() {
            let m = enc.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                MetricType::Counter,
            )?;
            ConstCounter::new(p.cpu_seconds).encode(m)?;
            gauge(
                &mut enc,
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                p.resident_bytes as f64,
            )?;
            gauge(
                &mut enc,
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                p.virtual_bytes as f64,
            )?;
            gauge(
                &mut enc,
                "process_open_fds",
                "Number of open file descriptors",
                p.open_fds as f64,
            )?;
            if let Some(max) = p.max_fds {
                gauge(
                    &mut enc,
                    "process_max_fds",
                    "Maximum number of open file descriptors",
                    max as f64,
                )?;
            }
            gauge(
                &mut enc,
                "process_threads",
                "Number of OS threads in the process",
                p.threads as f64,
            )?;
            gauge(
                &mut enc,
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch in seconds",
                p.start_time_seconds,
            )?;
        }
        #[cfg(not(target_os = "linux"))]
        let _ = (gauge, ConstCounter::new(0u64));
        Ok(())
    }
}

/// Registers `process_*` and `kvroute_build_info`.
pub fn register(registry: &mut Registry) {
    registry.register_collector(Box::new(ProcessCollector));
}

#[cfg(target_os = "linux")]
mod linux {
    use procfs::process::{LimitValue, Process};
    use procfs::WithCurrentSystemInfo;

    /// One reading of `/proc/self`.
    pub(super) struct Reading {
        pub(super) cpu_seconds: f64,
        pub(super) resident_bytes: u64,
        pub(super) virtual_bytes: u64,
        pub(super) open_fds: usize,
        pub(super) max_fds: Option<u64>,
        pub(super) threads: i64,
        pub(super) start_time_seconds: f64,
    }

    pub(super) fn read() -> Option<Reading> {
        let me = Process::myself().ok()?;
        let stat = me.stat().ok()?;
        let ticks = procfs::ticks_per_second() as f64;
        let boot = procfs::boot_time_secs().ok()? as f64;
        let max_fds = me
            .limits()
            .ok()
            .and_then(|l| match l.max_open_files.soft_limit {
                LimitValue::Value(v) => Some(v),
                LimitValue::Unlimited => None,
            });
        Some(Reading {
            cpu_seconds: (stat.utime + stat.stime) as f64 / ticks,
            resident_bytes: stat.rss_bytes().get(),
            virtual_bytes: stat.vsize,
            open_fds: me.fd_count().unwrap_or(0),
            max_fds,
            threads: stat.num_threads,
            start_time_seconds: boot + stat.starttime as f64 / ticks,
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_process_figures_and_the_version_are_exported() {
        let mut registry = prometheus_client::registry::Registry::default();
        super::register(&mut registry);
        let text = crate::metrics::render(&registry);
        assert!(text.contains(&format!(
            "kvroute_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        )));
        if cfg!(target_os = "linux") {
            for name in [
                "process_cpu_seconds_total ",
                "process_resident_memory_bytes ",
                "process_open_fds ",
                "process_threads ",
                "process_start_time_seconds ",
            ] {
                assert!(text.contains(name), "{name} missing in\n{text}");
            }
            let start: f64 = text
                .lines()
                .find_map(|l| l.strip_prefix("process_start_time_seconds "))
                .unwrap()
                .parse()
                .unwrap();
            assert!(start > 1.6e9, "{start}");
        }
    }
}
