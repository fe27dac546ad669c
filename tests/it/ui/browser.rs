//! The dashboard in a real browser (headless Chromium over WebDriver) against real
//! two-node clusters: what an operator sees and what the page's buttons do. Every
//! page is checked for console errors; failed waits leave a screenshot in
//! `target/ui-screenshots/`.

use std::time::Duration;

use serde_json::json;

use crate::support::browser::Browser;
use crate::support::{Cluster, Entry, entries, eventually, stream_row, xlen};

const ADMIN: &str = "ui-admin-token";
const READER: &str = "ui-read-token";

async fn two_nodes() -> Cluster {
    let tokens = format!("[api]\ntokens = [\"{ADMIN}\"]\nread_tokens = [\"{READER}\"]\n");
    let cluster = Cluster::start(2, 1, &tokens).await;
    // Both registered, so the node list is whole from the first look.
    eventually(Duration::from_secs(10), "both nodes registered", || async {
        let (_, n) = cluster.apis[0]
            .clone()
            .with_token(READER)
            .get("/v1/nodes")
            .await;
        (n["nodes"].as_array()?.len() == 2).then_some(())
    })
    .await;
    cluster
}

/// Opens the dashboard on node `i` and signs in with `token`.
async fn signed_in(cluster: &Cluster, i: usize, token: &str, name: &str) -> Browser {
    let browser = Browser::open(&cluster.apis[i].url(""), name).await;
    browser.goto("/ui#/overview").await;
    browser.fill("#token-input", token).await;
    browser.click("#token-save").await;
    browser
}

async fn push(cluster: &Cluster, id: &str, stream: &str, delay_ms: u64) {
    let api = cluster.apis[0].clone().with_token(ADMIN);
    api.schedule(id, stream, delay_ms).await;
}

async fn no_errors(browser: &Browser, page: &str) {
    let errors = browser.console_errors().await;
    assert!(errors.is_empty(), "console errors on {page}: {errors:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_shows_the_leader_live_numbers_and_every_page_without_errors() {
    let cluster = two_nodes().await;
    for i in 0..30 {
        push(
            &cluster,
            &format!("later-{i}"),
            "orders",
            600_000 + i * 1000,
        )
        .await;
    }
    let browser = signed_in(&cluster, 1, READER, "overview").await;
    browser
        .wait_text("#leader-node", "names the leader", |t| t.contains("n0"))
        .await;
    browser
        .wait_text("#node-role", "says this node is a standby", |t| {
            t.contains("standby")
        })
        .await;
    browser
        .wait_text("#pending-total", "counts what is pending", |t| {
            t.trim() == "30"
        })
        .await;
    // Live: messages flow, and the page follows without a reload. They keep
    // flowing until it does: the rate is the last 5 s sample's, which a page slowed
    // by a busy machine can miss if the messages come all at once.
    let flowing = tokio_util::sync::CancellationToken::new();
    let producer = {
        let (api, flowing) = (cluster.apis[0].clone().with_token(ADMIN), flowing.clone());
        tokio::spawn(async move {
            for i in 0.. {
                if flowing.is_cancelled() {
                    return;
                }
                api.schedule(&format!("now-{i}"), "orders", 200).await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    browser
        .wait_text("#delivered-rate", "shows deliveries", |t| {
            t.trim().parse::<f64>().is_ok_and(|r| r > 0.0)
        })
        .await;
    flowing.cancel();
    producer.await.unwrap();
    browser
        .wait_text("#nodes", "lists both nodes", |t| {
            t.contains("n0") && t.contains("n1")
        })
        .await;
    browser
        .wait_text("#history", "shows the term", |t| t.contains("n0"))
        .await;
    browser.screenshot("overview").await;
    no_errors(&browser, "overview").await;
    for page in ["streams", "messages", "dead", "schedules", "admin"] {
        browser.click(&format!("#nav-{page}")).await;
        browser
            .wait_for(&format!("#view[data-page='{page}']"), "the page drew")
            .await;
        tokio::time::sleep(Duration::from_millis(700)).await;
        browser.screenshot(page).await;
        no_errors(&browser, page).await;
    }
    // A read-only token sees everything and has no button to act with.
    browser.click("#nav-streams").await;
    browser
        .wait_for("#streams tr[data-stream='orders']", "the stream row")
        .await;
    assert_eq!(browser.count("button.pause, button.resume").await, 0);
    browser.click("#nav-admin").await;
    browser.wait_for("#fences", "the fences").await;
    assert_eq!(browser.count("#switchover-go, #reload-go").await, 0);
    // Redis gone: the page says so, and keeps trying.
    let mut cluster = cluster;
    cluster.redis.kill();
    browser.click("#nav-overview").await;
    browser
        .wait_text("#banner", "explains that Redis is down", |t| {
            t.contains("Redis unavailable")
        })
        .await;
    browser.screenshot("redis-down").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn looking_up_a_message_and_replaying_a_dead_letter_from_the_page() {
    let cluster = two_nodes().await;
    let admin = cluster.apis[0].clone().with_token(ADMIN);
    // A message kept past its ttl by a paused stream expires into the stream's
    // dead letters.
    admin
        .push_expiring(
            "invoices",
            json!({ "id": "late-invoice", "stream": "invoices", "payload": "x", "delay_ms": 0, "ttl_ms": 5 }),
        )
        .await;
    let dead = crate::support::within(Duration::from_secs(10), || async {
        (xlen(&mut cluster.redis.client(), "invoices:dead") == 1).then_some(())
    })
    .await;
    assert!(dead.is_some(), "no dead letter\n{}", cluster.logs());
    push(&cluster, "kept", "orders", 3_600_000).await;

    let browser = signed_in(&cluster, 0, ADMIN, "messages").await;
    browser.click("#nav-messages").await;
    browser.fill("#lookup-id", "kept").await;
    browser.click("#lookup-go").await;
    browser
        .wait_text("#lookup-result", "shows the state", |t| {
            t.contains("scheduled")
        })
        .await;
    // Delivered now from the page: it reaches its stream.
    browser.click("#msg-deliver-now").await;
    eventually(
        Duration::from_secs(10),
        "the message delivered now",
        || async {
            let e = entries(&mut cluster.redis.client(), "orders");
            (e.len() == 1 && e[0].get("delayq-id") == Some("kept")).then_some(())
        },
    )
    .await;
    browser.click("#lookup-go").await;
    browser
        .wait_text("#lookup-result", "shows it delivered", |t| {
            t.contains("delivered")
        })
        .await;
    browser.fill("#lookup-id", "late-invoice").await;
    browser.click("#lookup-go").await;
    browser
        .wait_text("#lookup-result", "shows the state", |t| {
            t.contains("expired")
        })
        .await;
    // Its page offers to replay its dead letter (the dead letters page does it below).
    browser
        .wait_text("#msg-replay", "the replay button", |t| {
            t.contains("Replay dead letter")
        })
        .await;
    no_errors(&browser, "messages").await;

    // The dead letter is replayed from the page and arrives.
    browser.goto("/ui#/dead?stream=invoices").await;
    browser
        .wait_text("#dead tr[data-entry-id]", "the dead letter's row", |t| {
            t.contains("expired") && t.contains("was due")
        })
        .await;
    browser.screenshot("dead").await;
    // Counted by a filter before anything is taken.
    for (reason, says) in [
        ("max_attempts", "0 dead letters"),
        ("expir", "1 dead letter matching reason \"expir…\""),
    ] {
        browser.fill("#dead-reason", reason).await;
        browser.click("#dead-count").await;
        browser
            .wait_text("#dead-matching", "the count", |t| t.starts_with(says))
            .await;
    }
    browser.agree("").await;
    browser.click("input.dead-select").await;
    browser.click("#dead-replay-selected").await;
    browser
        .wait_text("#status", "says what was replayed", |t| {
            t.contains("1 replayed")
        })
        .await;
    let arrived = eventually(Duration::from_secs(10), "the replayed message", || async {
        // Probes of the pause may be there before it.
        let e = entries(&mut cluster.redis.client(), "invoices");
        let replayed: Vec<Entry> = e
            .into_iter()
            .filter(|e| {
                e.get("delayq-id")
                    .is_some_and(|id| !id.starts_with("pause-probe"))
            })
            .collect();
        (!replayed.is_empty()).then_some(replayed)
    })
    .await;
    assert_eq!(arrived.len(), 1, "{arrived:?}");
    assert_eq!(arrived[0].get("delayq-id"), Some("late-invoice"));
    no_errors(&browser, "dead letters").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding_and_cancelling_a_business_key_and_listing_what_finished_from_the_page() {
    let cluster = two_nodes().await;
    let admin = cluster.apis[0].clone().with_token(ADMIN);
    for (id, delay_ms) in [
        ("o42-now", 0),
        ("o42-soon", 3_600_000),
        ("o42-later", 7_200_000),
    ] {
        let body = json!({ "id": id, "stream": "orders", "payload": id, "delay_ms": delay_ms, "key": "order-42" });
        let (status, answer) = admin.post("/v1/messages", body).await;
        assert_eq!(status, 201, "{answer}");
    }
    eventually(Duration::from_secs(10), "o42-now delivered", || async {
        (xlen(&mut cluster.redis.client(), "orders") == 1).then_some(())
    })
    .await;

    let browser = signed_in(&cluster, 1, ADMIN, "keys").await;
    browser
        .goto("/ui#/messages?stream=orders&key=order-42")
        .await;
    browser
        .wait_text("#key-result", "the key's three messages", |t| {
            t.contains("o42-soon") && t.contains("o42-later") && t.contains("delivered")
        })
        .await;
    browser.screenshot("key").await;
    // A message found by its key opens with its key shown.
    browser.click("#key-result a").await;
    browser
        .wait_text("#lookup-result", "the message with its key", |t| {
            t.contains("Business key") && t.contains("order-42")
        })
        .await;
    browser.agree("").await;
    browser.click("#key-cancel").await;
    browser
        .wait_text("#status", "says what was cancelled", |t| {
            t.contains("2 cancelled, 1 delivered")
        })
        .await;
    browser
        .wait_text("#key-result", "shows them cancelled", |t| {
            t.matches("cancelled").count() == 2
        })
        .await;
    let (_, got) = admin.get("/v1/messages/o42-later").await;
    assert_eq!(got["state"], json!("cancelled"), "{got}");
    // The stream's finished messages, newest first: the two cancelled, then the
    // one delivered before; by state, and by key. The Streams page links here.
    browser.goto("/ui#/messages?stream=orders&finished=1").await;
    let text = browser
        .wait_text("#finished-box", "what finished in orders", |t| {
            t.contains("o42-now") && t.matches("cancelled").count() == 2
        })
        .await;
    assert!(
        text.find("o42-later").unwrap() < text.find("o42-now").unwrap(),
        "newest first: {text}"
    );
    browser.screenshot("finished").await;
    browser
        .click("#finished-state option[value='delivered']")
        .await;
    browser.fill("#finished-key", "order-42").await;
    browser.click("#finished-go").await;
    browser
        .wait_text("#finished-box", "only the delivered one", |t| {
            t.contains("o42-now") && !t.contains("o42-later")
        })
        .await;
    browser.fill("#finished-key", "order-7").await;
    browser.click("#finished-go").await;
    browser
        .wait_text("#finished-box", "none of another key", |t| {
            t.contains("nothing delivered of key order-7 in orders")
        })
        .await;
    no_errors(&browser, "messages by key").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schedules_page_lists_schedules_and_pauses_one() {
    let cluster = two_nodes().await;
    let admin = cluster.apis[0].clone().with_token(ADMIN);
    let body = json!({ "id": "nightly", "stream": "reports", "payload": "r", "cron": "0 3 * * *", "timezone": "Europe/Berlin" });
    let (status, answer) = admin.post("/v1/schedules", body).await;
    assert_eq!(status, 201, "{answer}");
    let body = json!({ "id": "ping", "stream": "pings", "payload": "p", "every": "10m" });
    assert_eq!(admin.post("/v1/schedules", body).await.0, 201);

    let browser = signed_in(&cluster, 0, ADMIN, "schedules").await;
    browser.click("#nav-schedules").await;
    browser
        .wait_text("#schedules-box", "both schedules", |t| {
            t.contains("nightly")
                && t.contains("0 3 * * * (Europe/Berlin)")
                && t.contains("every 10m")
        })
        .await;
    browser.screenshot("list").await;
    browser.click("#schedule-pause-ping").await;
    browser
        .wait_text("#status", "says it paused", |t| {
            t.contains("Schedule ping paused")
        })
        .await;
    browser
        .wait_text("#schedules-box", "shows it paused", |t| {
            t.contains("paused")
        })
        .await;
    let (_, got) = admin.get("/v1/schedules/ping").await;
    assert_eq!(got["paused"], json!(true), "{got}");
    no_errors(&browser, "schedules").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_resume_and_switchover_from_the_page() {
    let cluster = two_nodes().await;
    let browser = signed_in(&cluster, 1, ADMIN, "admin").await;
    push(&cluster, "first", "orders", 0).await;
    eventually(Duration::from_secs(10), "the stream exists", || async {
        (xlen(&mut cluster.redis.client(), "orders") == 1).then_some(())
    })
    .await;
    browser
        .wait_text("#status", "says the token is saved", |t| {
            t.contains("Token saved")
        })
        .await;
    // A standby has no leadership to resign: no button, a note saying why.
    browser.click("#nav-admin").await;
    browser
        .wait_text("#resign-note", "says why there is no resign", |t| {
            t.contains("stands by")
        })
        .await;
    assert_eq!(browser.count("#resign-go[hidden]").await, 1);
    // The passing note stayed on the page it was said on.
    assert_eq!(browser.count("#status.ok").await, 0);
    browser.click("#nav-streams").await;
    browser.agree("").await;
    browser
        .click("#streams tr[data-stream='orders'] button.pause")
        .await;
    browser
        .wait_for(
            "#streams tr[data-stream='orders'][data-paused='true']",
            "shows it paused",
        )
        .await;
    for i in 0..10 {
        push(&cluster, &format!("held-{i}"), "orders", 100 + i).await;
    }
    eventually(Duration::from_secs(10), "all ten held", || async {
        let (_, s) = cluster.apis[0]
            .clone()
            .with_token(READER)
            .get("/v1/streams")
            .await;
        let o = stream_row(&s, "orders")?;
        (o["held"] == 10).then_some(())
    })
    .await;
    assert_eq!(
        xlen(&mut conn_of(&cluster), "orders"),
        1,
        "a paused stream gets nothing"
    );
    browser.screenshot("streams-paused").await;
    browser
        .click("#streams tr[data-stream='orders'] button.resume")
        .await;
    eventually(
        Duration::from_secs(10),
        "the held messages, once each",
        || async { (xlen(&mut conn_of(&cluster), "orders") == 11).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(xlen(&mut conn_of(&cluster), "orders"), 11, "nothing twice");
    no_errors(&browser, "streams").await;

    browser.click("#nav-admin").await;
    // The pause and the resume done from the page are in the audit trail.
    browser
        .wait_text("#audit-box", "the pause and resume recorded", |t| {
            t.contains("POST /v1/streams/{stream}/pause")
                && t.contains("POST /v1/streams/{stream}/resume")
        })
        .await;
    browser.screenshot("admin-audit").await;
    browser
        .wait_for("#switchover-to option[value='n1']", "the standby to choose")
        .await;
    browser.agree("").await;
    browser
        .client
        .execute(
            "document.getElementById('switchover-to').value = 'n1';",
            vec![],
        )
        .await
        .unwrap();
    browser.click("#switchover-go").await;
    browser
        .wait_text("#status", "says who leads now", |t| t.contains("n1"))
        .await;
    let (leader, _) = cluster.one_leader().wait(|| cluster.logs()).await;
    assert_eq!(leader, 1);
    browser.click("#nav-overview").await;
    browser
        .wait_text("#node-role", "this node leads now", |t| {
            t.contains("leader")
        })
        .await;
    // Leading now, it offers to resign.
    browser.click("#nav-admin").await;
    browser
        .wait_for("#resign-go:not([hidden])", "the resign button of a leader")
        .await;
    assert_eq!(browser.count("#resign-note[hidden]").await, 1);
    browser.click("#nav-overview").await;
    browser
        .wait_text("#history", "the switchover", |t| t.contains("switchover"))
        .await;
    no_errors(&browser, "admin").await;
}

fn conn_of(cluster: &Cluster) -> redis::Connection {
    cluster.redis.client()
}

/// A deployment with some history, every page in the light and the dark theme:
/// each page shows its data and logs no error. The screenshots it leaves in
/// `target/ui-screenshots/tour-*.png` are the README's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tour_of_every_page_in_both_themes() {
    let cluster = two_nodes().await;
    let admin = cluster.apis[0].clone().with_token(ADMIN);
    let mut conn = cluster.redis.client();
    crate::support::create_group(&mut conn, "orders", "billing");
    crate::support::create_group(&mut conn, "emails", "mailer");
    // A paused stream whose message outlives its ttl: a dead letter.
    assert_eq!(
        admin.post("/v1/streams/invoices/pause", json!({})).await.0,
        200
    );
    let (status, body) = admin
        .post("/v1/messages", json!({ "id": "invoice-7", "stream": "invoices", "fields": { "invoice": "7", "customer": "c-12" }, "delay_ms": 0, "ttl": "1s" }))
        .await;
    assert_eq!(status, 201, "{body}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        admin.post("/v1/streams/invoices/resume", json!({})).await.0,
        200
    );
    eventually(
        Duration::from_secs(10),
        "the expired message's dead letter",
        || async { (xlen(&mut cluster.redis.client(), "invoices:dead") == 1).then_some(()) },
    )
    .await;
    // Then paused again with messages waiting.
    assert_eq!(
        admin.post("/v1/streams/invoices/pause", json!({})).await.0,
        200
    );
    for i in 0..3 {
        push(&cluster, &format!("invoice-{}", 8 + i), "invoices", 0).await;
    }
    // A spread of due times, and traffic now.
    for i in 0..120u64 {
        let (stream, delay) = match i % 4 {
            0 => ("orders", 20_000 + i * 300),
            1 => ("orders", 600_000 + i * 20_000),
            2 => ("emails", 5_400_000 + i * 60_000),
            _ => ("emails", 2 * 86_400_000 + i),
        };
        push(&cluster, &format!("{stream}-{i}"), stream, delay).await;
    }
    for i in 0..60u64 {
        push(
            &cluster,
            &format!("now-{i}"),
            if i % 3 == 0 { "emails" } else { "orders" },
            200 + i * 150,
        )
        .await;
    }
    // A switchover in the history.
    let (status, body) = cluster.apis[0]
        .clone()
        .with_token(ADMIN)
        .with_timeout(Duration::from_secs(15))
        .post("/v1/admin/switchover", json!({ "to": "n1" }))
        .await;
    assert_eq!(status, 200, "{body}");
    eventually(Duration::from_secs(20), "a few samples", || async {
        let (_, o) = cluster.apis[1]
            .clone()
            .with_token(READER)
            .get("/v1/overview")
            .await;
        (o["rate"].as_array()?.len() >= 3).then_some(())
    })
    .await;

    let browser = signed_in(&cluster, 0, ADMIN, "tour").await;
    // Whichever node leads by now: on a loaded machine leadership may have moved
    // again since the switchover (the switchover's own tests follow it through).
    browser
        .wait_text("#leader-node", "a leader", |t| {
            t.contains("n0") || t.contains("n1")
        })
        .await;
    browser
        .wait_text("#history", "the switchover", |t| t.contains("switchover"))
        .await;
    browser
        .wait_text("#nodes", "both nodes", |t| {
            t.contains("n0") && t.contains("n1")
        })
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    browser.screenshot("overview").await;
    no_errors(&browser, "overview").await;
    browser.click("#theme-toggle").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    browser.screenshot("overview-dark").await;
    browser.click("#theme-toggle").await;

    browser.click("#nav-streams").await;
    browser
        .wait_for(
            "#streams tr[data-stream='invoices'][data-paused='true']",
            "the paused stream",
        )
        .await;
    browser
        .wait_text("#streams", "the consumer groups", |t| {
            t.contains("billing") && t.contains("mailer")
        })
        .await;
    for (what, lines) in [("delivered", 3), ("dead-lettered", 3)] {
        let selector = format!("#streams svg.spark[aria-label*='{what} per minute']");
        assert_eq!(
            browser.count(&selector).await,
            lines,
            "a line of the last hour's {what} messages for each stream"
        );
    }
    browser.screenshot("streams").await;
    no_errors(&browser, "streams").await;
    // The same lines over the last day, a point a quarter hour.
    browser.click("#window-day").await;
    browser
        .wait_text("#streams-note", "the day's lines", |t| {
            t.contains("quarter hour")
        })
        .await;
    let day = "#streams svg.spark[aria-label*='delivered per quarter hour']";
    assert_eq!(
        browser.count(day).await,
        3,
        "a line of the day for each stream"
    );
    no_errors(&browser, "streams, last day").await;
    browser.click("#window-hour").await;

    browser.click("#nav-messages").await;
    browser.fill("#lookup-id", "orders-1").await;
    browser.click("#lookup-go").await;
    browser
        .wait_text("#lookup-result", "the message", |t| t.contains("scheduled"))
        .await;
    browser
        .wait_text("#upcoming", "the next due", |t| t.contains("invoice-8"))
        .await;
    browser.screenshot("messages").await;
    no_errors(&browser, "messages").await;

    browser.goto("/ui#/dead?stream=invoices").await;
    browser
        .wait_text("#dead", "the dead letter", |t| t.contains("invoice-7"))
        .await;
    browser.screenshot("dead").await;
    no_errors(&browser, "dead letters").await;

    browser.click("#nav-admin").await;
    browser.wait_for("#fences", "the fences").await;
    browser
        .wait_for("#switchover-go", "the switchover form")
        .await;
    browser.screenshot("admin").await;
    no_errors(&browser, "admin").await;
}
