//! Failures a reader of an output's tail can still name: the panic hook keeps each
//! thread's last panic message, and a message long enough to push its own first
//! line out of sight (one carrying the nodes' logs) is named again after it.

use std::cell::RefCell;
use std::sync::Once;

/// A message of more lines than this gets its one-line summary after it.
const LONG: usize = 8;

thread_local! {
    /// The message of this thread's last panic, and where it was raised.
    static LAST: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Installs the hook (once per process); every panic still reaches the hook
/// before it, so the default printing is unchanged.
pub fn install() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let print = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = info
                .payload()
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| info.payload().downcast_ref::<&str>().copied())
                .unwrap_or("(no message)");
            let at = info
                .location()
                .map(|l| format!(" at {l}"))
                .unwrap_or_default();
            print(info);
            if let Some(summary) = summary(message, &at) {
                eprintln!("{summary}");
            }
            LAST.with(|p| *p.borrow_mut() = Some(format!("{message}{at}")));
        }));
    });
}

/// The line that names a long failure again, or none for a short one.
fn summary(message: &str, at: &str) -> Option<String> {
    let mut lines = message.lines();
    let first = lines.next().unwrap_or("");
    (lines.count() >= LONG).then(|| format!("--- the test failed (message above): {first}{at}"))
}

/// This thread's last panic message (with where), taken.
pub fn take_last() -> Option<String> {
    LAST.with(|p| p.borrow_mut().take())
}

#[test]
fn only_long_messages_are_named_again_by_their_first_line() {
    let long = format!("no leader\n{}", "log line\n".repeat(LONG));
    assert_eq!(
        summary(&long, " at x.rs:1:2").as_deref(),
        Some("--- the test failed (message above): no leader at x.rs:1:2")
    );
    let short = format!("no leader\n{}", "log line\n".repeat(LONG - 1));
    assert_eq!(summary(&short, " at x.rs:1:2"), None);
    assert_eq!(summary("", ""), None);
}
