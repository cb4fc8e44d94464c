//! WAF over windows of a report's time series: the figures an experiment reads off a run
//! (the steady state after the device settled, and the WAF over time as data is written).

use crate::report::SeriesRow;

/// The WAF of the second half of the host pages written: the run's steady state, after the
/// workload and the device's free space have settled (the cumulative WAF still carries the
/// first fill's GC-free writes). An interval counts whole once the pages before it pass the
/// half. None when no interval of the second half wrote anything.
pub fn steady_waf(series: &[SeriesRow], host_write_pages: u64) -> Option<f64> {
    let half = host_write_pages / 2;
    let (mut host, mut nand, mut seen) = (0u64, 0u64, 0u64);
    for row in series {
        seen += row.host_write_pages;
        if seen > half {
            host += row.host_write_pages;
            nand += row.nand_write_pages;
        }
    }
    (host > 0).then(|| nand as f64 / host as f64)
}

/// (GiB of host data written, WAF over the last twentieth of the run's host pages) at each
/// interval's end, from the first interval by which a twentieth was written.
pub fn windowed_waf(
    series: &[SeriesRow],
    host_write_pages: u64,
    page_bytes: u64,
) -> Vec<(f64, f64)> {
    let window = (host_write_pages / 20).max(1);
    let mut out = Vec::new();
    let (mut start, mut host, mut nand, mut total) = (0usize, 0u64, 0u64, 0u64);
    for (i, row) in series.iter().enumerate() {
        host += row.host_write_pages;
        nand += row.nand_write_pages;
        total += row.host_write_pages;
        // Drop the oldest intervals while the window stays full without them.
        while start < i && host - series[start].host_write_pages >= window {
            host -= series[start].host_write_pages;
            nand -= series[start].nand_write_pages;
            start += 1;
        }
        if host >= window {
            let gib = (total * page_bytes) as f64 / (1u64 << 30) as f64;
            out.push((gib, nand as f64 / host as f64));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(host: u64, nand: u64) -> SeriesRow {
        SeriesRow {
            end_ns: 0,
            host_write_pages: host,
            nand_write_pages: nand,
            waf: 0.0,
            waf_cumulative: 0.0,
            iops: 0.0,
            free_superblocks: 0,
            mapping_bytes: 0,
            traffic: Default::default(),
            placements: Vec::new(),
        }
    }

    /// A fill without GC (WAF 1) then a steady state at WAF 3: the steady-state WAF is the
    /// second half's, where the cumulative WAF (2) is not.
    #[test]
    fn the_steady_state_is_the_second_half_of_the_data() {
        let series: Vec<SeriesRow> = (0..10)
            .map(|i| if i < 5 { row(100, 100) } else { row(100, 300) })
            .collect();
        assert_eq!(steady_waf(&series, 1000), Some(3.0));
        // The half falls inside an interval: that interval counts whole.
        let series = vec![row(300, 300), row(400, 800), row(300, 900)];
        assert_eq!(steady_waf(&series, 1000), Some((800.0 + 900.0) / 700.0));
        assert_eq!(steady_waf(&[], 0), None);
        assert_eq!(steady_waf(&[row(0, 5)], 0), None);
    }

    /// Against a brute-force window: at each interval, the fewest latest intervals holding at
    /// least a twentieth of the pages.
    #[test]
    fn the_window_is_the_latest_twentieth_of_the_data() {
        let series: Vec<SeriesRow> = (0..200u64)
            .map(|i| row(10 + i % 7, (10 + i % 7) * (1 + i % 3)))
            .collect();
        let total: u64 = series.iter().map(|r| r.host_write_pages).sum();
        let got = windowed_waf(&series, total, 4096);
        let window = total / 20;
        let mut want = Vec::new();
        let mut written = 0;
        for i in 0..series.len() {
            written += series[i].host_write_pages;
            let (mut host, mut nand) = (0, 0);
            for r in series[..=i].iter().rev() {
                host += r.host_write_pages;
                nand += r.nand_write_pages;
                if host >= window {
                    break;
                }
            }
            if host >= window {
                want.push((
                    (written * 4096) as f64 / (1u64 << 30) as f64,
                    nand as f64 / host as f64,
                ));
            }
        }
        assert_eq!(got, want);
        assert!(windowed_waf(&[], 0, 4096).is_empty());
    }
}
