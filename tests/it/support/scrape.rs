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

/// The metrics table of docs/metrics.md (its "## Metrics" section, as the file says
/// now), one `(name, labels, type, meaning)` per row: `labels` as the row writes them
/// inside the braces (`stream,group`), empty for none.
pub fn documented_metrics() -> Vec<(String, String, String, String)> {
    let readme = std::fs::read_to_string(super::repo().join("docs/metrics.md")).unwrap();
    let table = &readme[readme.find("## Metrics").expect("a Metrics section")..];
    let table = &table[..table[3..].find("\n## ").map_or(table.len(), |i| i + 3)];
    table
        .lines()
        .filter(|l| l.starts_with("| `delayq_") || l.starts_with("| `process_"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split(" | ").map(str::trim).collect();
            assert_eq!(cells.len(), 3, "a row of three cells: {l}");
            let series = cells[0].trim_matches('`');
            let (name, labels) = series.split_once('{').unwrap_or((series, "}"));
            (
                name.to_owned(),
                labels.trim_end_matches('}').to_owned(),
                cells[1].to_owned(),
                cells[2].to_owned(),
            )
        })
        .collect()
}
