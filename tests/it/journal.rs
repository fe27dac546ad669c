//! The journal's schema on a real MariaDB (started here: its own data directory, a
//! loopback port): `delayq journal migrate` creates it, again changes nothing,
//! several at once migrate once; the password comes from a file and shows nowhere.

use std::path::Path;
use std::process::Output;

use delayq::harness::MariaDbServer;

use crate::support::{delayq_bin, text};

/// A config naming `db`'s journal, its password in a file in `dir`.
fn config(db: &MariaDbServer, dir: &Path, password: &str) -> std::path::PathBuf {
    let password_file = dir.join("journal-password");
    std::fs::write(&password_file, format!("{password}\n")).unwrap();
    let path = dir.join("delayq.toml");
    std::fs::write(
        &path,
        format!(
            "[journal]\nurl = \"{}\"\npassword_file = \"{}\"\n",
            db.url(),
            password_file.display()
        ),
    )
    .unwrap();
    path
}

async fn delayq(args: &[&str], config: &Path) -> Output {
    tokio::process::Command::new(delayq_bin())
        .args(args)
        .arg("--config")
        .arg(config)
        .env_remove("DELAYQ_CONFIG")
        .output()
        .await
        .unwrap()
}

fn said(out: &Output) -> String {
    format!("{}{}", text(&out.stdout), text(&out.stderr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schema_is_made_once_and_migrating_again_changes_nothing() {
    let db = tokio::task::spawn_blocking(MariaDbServer::start)
        .await
        .unwrap()
        .expect("start MariaDB");
    let dir = tempfile::tempdir().unwrap();
    let path = config(&db, dir.path(), &db.password);

    // Three instances migrating at once: one migrates, the others find it done.
    let runs =
        futures::future::join_all((0..3).map(|_| delayq(&["journal", "migrate"], &path))).await;
    for out in &runs {
        assert!(out.status.success(), "{}", said(out));
        assert!(!said(out).contains(&db.password), "{}", said(out));
    }
    let outputs: Vec<String> = runs
        .iter()
        .map(|o| text(&o.stdout).trim().to_owned())
        .collect();
    assert_eq!(
        outputs
            .iter()
            .filter(|o| *o == "journal schema: version 0 -> 1")
            .count(),
        1,
        "{outputs:?}"
    );
    assert_eq!(
        outputs
            .iter()
            .filter(|o| *o == "journal schema: version 1 (up to date)")
            .count(),
        2,
        "{outputs:?}"
    );
    let applied = db
        .sql("SELECT version, name FROM delayq.delayq_schema")
        .unwrap();
    assert_eq!(applied.trim(), "1\tmessages");
    let indexes = db
        .sql("SELECT DISTINCT INDEX_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = 'delayq' AND TABLE_NAME = 'delayq_messages' ORDER BY INDEX_NAME")
        .unwrap();
    let mut indexes: Vec<&str> = indexes.split_whitespace().collect();
    indexes.sort_unstable();
    assert_eq!(indexes, ["PRIMARY", "by_state_due", "by_state_updated"]);

    let out = delayq(&["journal", "version"], &path).await;
    assert!(out.status.success(), "{}", said(&out));
    assert_eq!(
        text(&out.stdout).trim(),
        "journal schema: version 1 (this delayq: 1)"
    );

    // A wrong password: refused, and neither password is shown.
    let wrong = tempfile::tempdir().unwrap();
    let bad = config(&db, wrong.path(), "not-the-password");
    let out = delayq(&["journal", "migrate"], &bad).await;
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    assert!(said(&out).contains("Access denied"), "{}", said(&out));
    assert!(!said(&out).contains("not-the-password") && !said(&out).contains(&db.password));

    // The daemon does not run with a journal it would not write yet.
    let out = delayq(&["run"], &path).await;
    assert_eq!(out.status.code(), Some(64), "{}", said(&out));
    assert!(
        said(&out).contains("journal.url: the daemon does not journal messages yet"),
        "{}",
        said(&out)
    );
}
