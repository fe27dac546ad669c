//! Reading a `/metrics` text (Prometheus's exposition format) as an operator's
//! scraper would.

/// The sum of a counter's series (0 if it has none).
pub fn counter(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The value of one series, named with its labels as the text writes them.
pub fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// The sample lines (not comments) of the metrics whose names start with `prefix`,
/// without their values.
pub fn series<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .map(|l| l.rsplit_once(' ').map_or(l, |(series, _)| series))
        .collect()
}
