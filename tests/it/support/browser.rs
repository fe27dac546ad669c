//! A real headless Chromium, driven over WebDriver (`chromedriver`, started here on
//! a free loopback port and killed on drop). Every wait takes a screenshot into
//! `target/ui-screenshots/` before it fails, and `console_errors` reads what the
//! page logged as errors (chromedriver's browser log).

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

use super::within;

pub struct Browser {
    pub client: Client,
    driver: Child,
    port: u16,
    /// The node's base URL (`http://host:port`).
    base: String,
    /// Screenshots go to `target/ui-screenshots/<name>-*.png`.
    name: String,
}

/// Where screenshots go.
pub fn screenshots() -> PathBuf {
    super::repo().join("target").join("ui-screenshots")
}

impl Browser {
    /// A browser window of a laptop's size on the node at `base`.
    pub async fn open(base: &str, name: &str) -> Browser {
        Self::open_with(base, name, &[]).await
    }

    /// [`Browser::open`], with more Chromium arguments.
    pub async fn open_with(base: &str, name: &str, more: &[&str]) -> Browser {
        let port = delayq_harness::free_port();
        // Its own process group, so that drop ends Chromium with it.
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver (install chromium-driver)");
        let mut args = vec![
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--window-size=1366,900",
        ];
        args.extend_from_slice(more);
        let caps = json!({
            "goog:chromeOptions": { "args": args },
            "goog:loggingPrefs": { "browser": "ALL" },
        });
        let caps = caps.as_object().unwrap().clone();
        let url = format!("http://127.0.0.1:{port}");
        let client = within(Duration::from_secs(20), || {
            let caps = caps.clone();
            let url = url.clone();
            async move {
                // Plain HTTP on loopback: no TLS stack.
                let http = hyper_util::client::legacy::connect::HttpConnector::new();
                ClientBuilder::new(http)
                    .capabilities(caps)
                    .connect(&url)
                    .await
                    .ok()
            }
        })
        .await
        .expect("a WebDriver session from chromedriver");
        std::fs::create_dir_all(screenshots()).unwrap();
        Browser {
            client,
            driver,
            port,
            base: base.trim_end_matches('/').to_owned(),
            name: name.to_owned(),
        }
    }

    /// Opens `path` (e.g. `/ui#/streams`) on the node.
    pub async fn goto(&self, path: &str) {
        self.client
            .goto(&format!("{}{path}", self.base))
            .await
            .expect("navigate");
    }

    /// Saves a screenshot as `target/ui-screenshots/<name>-<what>.png`.
    pub async fn screenshot(&self, what: &str) -> PathBuf {
        let path = screenshots().join(format!("{}-{what}.png", self.name));
        if let Ok(png) = self.client.screenshot().await {
            let _ = std::fs::write(&path, png);
        }
        path
    }

    /// The text of the first element matching `css`, once `check` accepts it.
    pub async fn wait_text(&self, css: &str, what: &str, check: impl Fn(&str) -> bool) -> String {
        let found = within(Duration::from_secs(20), || async {
            let text = self
                .client
                .find(Locator::Css(css))
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            check(&text).then_some(text)
        })
        .await;
        match found {
            Some(text) => text,
            None => self.fail(&format!("{css}: {what}")).await,
        }
    }

    /// Waits until an element matches `css`.
    pub async fn wait_for(&self, css: &str, what: &str) {
        let found = within(Duration::from_secs(20), || async {
            self.client.find(Locator::Css(css)).await.ok()
        })
        .await;
        if found.is_none() {
            self.fail(&format!("{css}: {what}")).await;
        }
    }

    /// How many elements match `css` now.
    pub async fn count(&self, css: &str) -> usize {
        self.client
            .find_all(Locator::Css(css))
            .await
            .map_or(0, |all| all.len())
    }

    /// Clicks the first element matching `css` (waiting for it). The pages redraw
    /// their tables as they refresh: an element replaced between being found and
    /// being clicked is found again and clicked then.
    pub async fn click(&self, css: &str) {
        let clicked = within(Duration::from_secs(20), || async {
            let tried = match self.client.find(Locator::Css(css)).await {
                Ok(element) => element.click().await,
                Err(e) => Err(e),
            };
            match tried {
                Err(e) if e.is_stale_element_reference() || e.is_no_such_element() => None,
                done => Some(done),
            }
        })
        .await;
        match clicked {
            Some(Ok(())) => {}
            Some(Err(e)) => self.fail(&format!("click {css}: {e}")).await,
            None => self.fail(&format!("{css}: to click")).await,
        }
    }

    /// Types `text` into the input matching `css` (cleared first).
    pub async fn fill(&self, css: &str, text: &str) {
        self.wait_for(css, "to type into").await;
        let input = self.client.find(Locator::Css(css)).await.expect("find");
        input.clear().await.expect("clear");
        input.send_keys(text).await.expect("type");
    }

    /// Makes `confirm` and `prompt` answer as a user who agrees (`prompt`: with
    /// `answer`), for the page loaded now.
    pub async fn agree(&self, answer: &str) {
        self.client
            .execute(
                "window.confirm = () => true; window.prompt = () => arguments[0];",
                vec![Value::String(answer.to_owned())],
            )
            .await
            .expect("replace confirm and prompt");
    }

    /// The errors the page logged (console errors, uncaught exceptions, failed
    /// loads) since the last call.
    pub async fn console_errors(&self) -> Vec<String> {
        let session = self
            .client
            .session_id()
            .await
            .ok()
            .flatten()
            .unwrap_or_default();
        let url = format!("http://127.0.0.1:{}/session/{session}/se/log", self.port);
        super::http::tls_provider();
        let answer: Value = reqwest::Client::new()
            .post(url)
            .json(&json!({ "type": "browser" }))
            .send()
            .await
            .expect("ask chromedriver for the browser log")
            .json()
            .await
            .expect("a JSON log");
        answer["value"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["level"] == "SEVERE")
            .map(|e| e["message"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    async fn fail(&self, what: &str) -> ! {
        let shot = self.screenshot("failure").await;
        let log = self.console_errors().await;
        panic!(
            "browser: {what} (screenshot {}; console errors {log:?})",
            shot.display()
        );
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // SAFETY: a plain kill(2) of the process group chromedriver leads.
        unsafe { libc::kill(-(self.driver.id() as i32), libc::SIGKILL) };
        let _ = self.driver.wait();
    }
}
