//! `delayq functions`: the function libraries other versions left in Redis listed
//! and pruned, others' libraries untouched, and a store whose own library was
//! removed loading it again at its next call.

use std::collections::BTreeSet;
use std::time::Duration;

use delayq_client::message::NewMessage;
use delayq_client::store::{ScheduleMode, Scheduled, Status, Store};

use crate::support::{Bare, delayq_with_config, libraries, text};

/// A library named `name` with one function, loaded through `conn`.
pub(crate) fn load_library(conn: &mut impl redis::ConnectionLike, name: &str) {
    let body = format!(
        "#!lua name={name}\nredis.register_function('{name}_get', function() return 1 end)"
    );
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(body)
        .query(conn)
        .unwrap();
}

/// `delayq functions <args>` against the deployment of `config` (TOML): whether
/// it succeeded, and what it printed.
pub(crate) async fn functions(config: &str, args: &[&str]) -> (bool, String) {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), config).unwrap();
    let mut all = vec!["functions"];
    all.extend(args);
    let out = delayq_with_config(&all, file.path()).await;
    (out.status.success(), text(&out.stdout) + &text(&out.stderr))
}

fn held(conn: &mut impl redis::ConnectionLike) -> BTreeSet<String> {
    libraries(conn).into_iter().collect()
}

#[tokio::test]
async fn prune_removes_other_versions_libraries_and_leaves_the_rest() {
    let bare = Bare::start("").await;
    let config = format!(
        "[redis]\nurl = \"{}\"\nshards = {}\n",
        bare.redis.url(),
        bare.config.redis.shards
    );
    let mut conn = bare.redis.client();
    let msg = NewMessage::payload("orders", "kept", Duration::from_secs(600));
    let stored = bare
        .store
        .schedule(&msg, ScheduleMode::New, Duration::from_secs(3600))
        .await;
    assert!(
        matches!(stored, Ok(Scheduled::Scheduled { .. })),
        "{stored:?}"
    );
    let current = Store::library_name().to_owned();
    // An older version's library, and two that only look like delayq's.
    let old = "delayq_00000000000000aa";
    for name in [old, "delayq_mine", "other"] {
        load_library(&mut conn, name);
    }
    let everything: BTreeSet<String> = [current.as_str(), old, "delayq_mine", "other"]
        .map(String::from)
        .into();
    assert_eq!(held(&mut conn), everything);

    let (ok, listed) = functions(&config, &["list"]).await;
    assert!(ok, "{listed}");
    assert!(
        listed.contains(&format!("this version's library: {current}"))
            && listed.contains("redis: 2 libraries of delayq's")
            && listed.contains(&format!("{current}  26 functions  (this version)"))
            && listed.contains(&format!("{old}  1 function  (another version)"))
            && !listed.contains("delayq_mine")
            && !listed.lines().any(|l| l.trim_start().starts_with("other")),
        "{listed}"
    );

    // A dry run says what it would remove and removes nothing.
    let (ok, dry) = functions(&config, &["prune", "--dry-run"]).await;
    assert!(
        ok && dry.contains(&format!("would remove {old}\n"))
            && !dry.contains(&format!("would remove {current}"))
            && dry.contains("1 library would be removed (--dry-run: nothing removed)"),
        "{dry}"
    );
    assert_eq!(held(&mut conn), everything);
    let (ok, dry) = functions(&config, &["prune", "--all", "--dry-run"]).await;
    assert!(
        ok && dry.contains(&format!("would remove {current}\n"))
            && dry.contains("2 libraries would be removed"),
        "{dry}"
    );
    assert_eq!(held(&mut conn), everything);

    let (ok, pruned) = functions(&config, &["prune"]).await;
    assert!(ok, "{pruned}");
    assert!(
        pruned.contains(&format!("removed {old}\n"))
            && pruned.contains("1 library removed")
            && pruned.contains("redis: 1 library of delayq's"),
        "{pruned}"
    );
    let mut expected = everything.clone();
    expected.remove(old);
    assert_eq!(held(&mut conn), expected);

    // Nothing more to prune.
    let (ok, again) = functions(&config, &["prune"]).await;
    assert!(ok && again.contains("0 libraries removed"), "{again}");
    assert_eq!(held(&mut conn), expected);

    // --all takes this version's too; the store loads it again at its next call.
    let (ok, all) = functions(&config, &["prune", "--all"]).await;
    assert!(
        ok && all.contains(&format!("removed {current}\n"))
            && all.contains("redis: no library of delayq's"),
        "{all}"
    );
    expected.remove(&current);
    assert_eq!(held(&mut conn), expected);
    assert!(
        matches!(bare.store.get(&msg.id).await, Ok(Status::Scheduled(_))),
        "the message is still there"
    );
    expected.insert(current);
    assert_eq!(
        held(&mut conn),
        expected,
        "the store loaded its library again"
    );
}

#[tokio::test]
async fn functions_says_which_redis_it_could_not_reach() {
    let (ok, out) = functions(
        "[redis]\nurl = \"redis://127.0.0.1:1\"\nconnect_timeout = \"200ms\"\n",
        &["list"],
    )
    .await;
    assert!(
        !ok && out.contains("connect to Redis at redis://127.0.0.1:1"),
        "{out}"
    );
}
