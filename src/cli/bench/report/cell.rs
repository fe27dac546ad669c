//! How a figure reads in a table: "–" for none, whole numbers from 10 000 up in
//! groups of three digits, anything else as results.json has it.

pub(super) trait Cell {
    fn cell(&self) -> String;
}

impl Cell for u64 {
    fn cell(&self) -> String {
        if *self >= 10_000 {
            group(*self as i64)
        } else {
            self.to_string()
        }
    }
}

impl Cell for i64 {
    fn cell(&self) -> String {
        if self.abs() >= 10_000 {
            group(*self)
        } else {
            self.to_string()
        }
    }
}

impl Cell for u32 {
    fn cell(&self) -> String {
        u64::from(*self).cell()
    }
}

impl Cell for u16 {
    fn cell(&self) -> String {
        u64::from(*self).cell()
    }
}

impl Cell for usize {
    fn cell(&self) -> String {
        (*self as u64).cell()
    }
}

impl Cell for f64 {
    fn cell(&self) -> String {
        if self.fract() == 0.0 && self.abs() >= 10_000.0 {
            return group(*self as i64);
        }
        // JSON's spelling ("2.0", not "2"); JSON has no NaN or infinity.
        serde_json::Number::from_f64(*self).map_or_else(|| "–".to_owned(), |n| n.to_string())
    }
}

impl Cell for str {
    fn cell(&self) -> String {
        self.to_owned()
    }
}

impl Cell for String {
    fn cell(&self) -> String {
        self.clone()
    }
}

impl<T: Cell> Cell for Option<T> {
    fn cell(&self) -> String {
        self.as_ref().map_or_else(|| "–".to_owned(), Cell::cell)
    }
}

/// 1234567 → "1 234 567", so large rates read at a glance.
fn group(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push('\u{202f}');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}
