//! Closed-form write amplification, the curves a sweep's measured figures are drawn against.

/// Principal branch of Lambert's W on [-1/e, 0), by Halley's iteration from the branch-point
/// series.
pub fn lambert_w0(x: f64) -> f64 {
    assert!((-1.0 / std::f64::consts::E..0.0).contains(&x), "{x}");
    let p = (2.0 * (std::f64::consts::E * x + 1.0)).sqrt();
    let mut w = -1.0 + p - p * p / 3.0 + 11.0 / 72.0 * p * p * p;
    for _ in 0..50 {
        let ew = w.exp();
        let f = w * ew - x;
        let step = f / (ew * (w + 1.0) - (w + 2.0) * f / (2.0 * w + 2.0));
        w -= step;
        if step.abs() < 1e-15 {
            break;
        }
    }
    w
}

/// Greedy GC under uniform random writes, in the limit of large blocks, at over-provisioning
/// `rho` (spare / logical): A = alpha / (alpha + W0(-alpha e^-alpha)) with alpha = 1 + rho
/// (P. Desnoyers, "Analytic Modeling of SSD Write Performance", SYSTOR 2012).
pub fn desnoyers_greedy_waf(rho: f64) -> f64 {
    assert!(rho > 0.0, "over-provisioning {rho} must be > 0");
    let alpha = 1.0 + rho;
    alpha / (alpha + lambert_w0(-alpha * (-alpha).exp()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn desnoyers_model_gives_the_published_limits() {
        assert!((desnoyers_greedy_waf(0.07) - 7.82).abs() < 0.01);
        assert!((desnoyers_greedy_waf(0.28) - 2.48).abs() < 0.01);
    }
}
