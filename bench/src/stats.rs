//! Percentiles, medians over runs and how the report prints them.

pub(crate) fn pct(sorted: &[i64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[idx] as f64
}

pub(crate) fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// The smallest and largest finite values (infinite ones when there are none).
pub(crate) fn min_max(v: &[f64]) -> (f64, f64) {
    let s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    (s.iter().copied().fold(f64::INFINITY, f64::min), s.iter().copied().fold(f64::NEG_INFINITY, f64::max))
}

/// "median (min–max)" with `digits` decimals; only the median with one sample.
pub(crate) fn mmm(v: &[f64], digits: usize) -> String {
    let m = median(v);
    if !m.is_finite() {
        return "–".into();
    }
    let (lo, hi) = min_max(v);
    if v.len() > 1 {
        format!("{m:.digits$} ({lo:.digits$}–{hi:.digits$})")
    } else {
        format!("{m:.digits$}")
    }
}

pub(crate) fn ratio(a: f64, b: f64) -> String {
    if a.is_finite() && b.is_finite() && b > 0.0 {
        format!("{:.2}×", a / b)
    } else {
        "–".into()
    }
}
