//! The shell-style globs of `streams.allow`.

/// Shell-style glob: `*` matches any run of characters, `?` any one character.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            pi += 1;
            mark = ti;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check_glob(pattern: &str, text: &str, expected: bool) {
        assert_eq!(glob_match(pattern, text), expected, "{pattern} ~ {text}");
    }

    #[test]
    fn globs() {
        check_glob("*", "", true);
        check_glob("*", "orders", true);
        check_glob("orders", "orders", true);
        check_glob("orders", "orders2", false);
        check_glob("orders*", "orders:eu", true);
        check_glob("*:eu", "orders:eu", true);
        check_glob("*:eu", "orders:us", false);
        check_glob("o?ders", "orders", true);
        check_glob("a*b*c", "aXXbYYc", true);
        check_glob("a*b*c", "aXXbYY", false);
    }
}
