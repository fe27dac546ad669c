//! README.md and every document in docs/ as a new user reads them: every TOML
//! snippet passes `check-config`, every `curl` example gets the answer the text
//! shows from a real daemon, the Rust client example is the compiled
//! `client/examples/producer.rs`, every `delayq` command line parses, and every relative
//! link names a file that exists. So the docs cannot drift from the code.

use std::path::Path;
use std::process::Command;

use crate::support::{Env, delayq_bin, repo, text};

/// A fenced code block of a document: its language, where it starts (the file and
/// its first line) and its text.
struct Block {
    lang: String,
    line: Place,
    text: String,
}

/// A line of a document, shown as `docs/api.md line 12`.
#[derive(Clone, Copy, Debug)]
struct Place {
    file: &'static str,
    line: usize,
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} line {}", self.file, self.line)
    }
}

impl std::ops::Add<usize> for Place {
    type Output = Place;
    fn add(self, lines: usize) -> Place {
        Place {
            file: self.file,
            line: self.line + lines,
        }
    }
}

/// README.md, then every Markdown file of docs/ by name: (path from the repository, text).
fn documents() -> Vec<(&'static str, String)> {
    let mut names = vec!["README.md".to_owned()];
    let mut docs: Vec<String> = std::fs::read_dir(repo().join("docs"))
        .expect("read docs/")
        .map(|e| {
            e.expect("a docs/ entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    docs.sort();
    names.extend(docs);
    names
        .into_iter()
        .map(|name| {
            let text = std::fs::read_to_string(repo().join(&name))
                .unwrap_or_else(|e| panic!("read {name}: {e}"));
            (&*Box::leak(name.into_boxed_str()), text)
        })
        .collect()
}

/// Every fenced block of a document, indented ones (inside a list) included, their
/// indent removed.
fn blocks(file: &'static str, readme: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, Block)> = None;
    for (i, line) in readme.lines().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        match (&mut open, trimmed.strip_prefix("```")) {
            (None, Some(lang)) => {
                let block = Block {
                    lang: lang.trim().to_owned(),
                    line: Place { file, line: i + 2 },
                    text: String::new(),
                };
                open = Some((indent, block));
            }
            (Some(_), Some("")) => blocks.push(open.take().expect("an open block").1),
            (Some((indent, block)), _) => {
                block.text += line.get(*indent..).unwrap_or(trimmed);
                block.text.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "{file}: a code block is not closed");
    blocks
}

/// The blocks of one language in every document, README.md's first.
fn blocks_of(lang: &str) -> Vec<Block> {
    documents()
        .into_iter()
        .flat_map(|(file, text)| blocks(file, &text))
        .filter(|b| b.lang == lang)
        .collect()
}

/// The files a snippet names (`*_file = "..."`, in tables inline or not), made in
/// `dir`: certificates and keys as PEM, anything else a secret line. A relative name
/// is read from `$CREDENTIALS_DIRECTORY` (`dir/credentials`), an absolute one is
/// moved under `dir`. Returns the snippet with its absolute paths moved.
fn make_named_files(snippet: &str, dir: &Path) -> String {
    let credentials = dir.join("credentials");
    std::fs::create_dir_all(&credentials).expect("credentials dir");
    let key_pair = rcgen::KeyPair::generate().expect("a key");
    let cert = rcgen::CertificateParams::new(vec!["redis.internal".to_owned()])
        .expect("certificate params")
        .self_signed(&key_pair)
        .expect("a certificate");
    let mut moved = String::new();
    for line in snippet.lines() {
        let mut line = line.to_owned();
        let names: Vec<(String, String)> = line
            .match_indices("_file")
            .filter_map(|(at, _)| {
                let key_start = line[..at].rfind([' ', '{', ',']).map_or(0, |i| i + 1);
                let rest = line[at + "_file".len()..].trim_start().strip_prefix('=')?;
                let value = rest.trim_start().strip_prefix('"')?;
                let value = &value[..value.find('"')?];
                Some((
                    line[key_start..at + "_file".len()].to_owned(),
                    value.to_owned(),
                ))
            })
            .collect();
        if line.trim_start().starts_with('#') {
            moved += &line;
            moved.push('\n');
            continue;
        }
        for (key, name) in names {
            let content = if key.ends_with("key_file") {
                key_pair.serialize_pem()
            } else if key.starts_with("tls_") {
                cert.pem()
            } else {
                "readme-secret\n".to_owned()
            };
            let path = if Path::new(&name).is_absolute() {
                let path = dir.join(name.trim_start_matches('/'));
                line = line.replace(&format!("\"{name}\""), &format!("\"{}\"", path.display()));
                path
            } else {
                credentials.join(&name)
            };
            std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
            std::fs::write(&path, content).expect("write a named file");
        }
        moved += &line;
        moved.push('\n');
    }
    moved
}

#[test]
fn every_toml_snippet_passes_check_config() {
    let snippets: Vec<Block> = blocks_of("toml")
        .into_iter()
        // A Cargo manifest's lines, not delayq's configuration.
        .filter(|b| !b.text.contains("[dependencies]"))
        .collect();
    assert!(snippets.len() >= 10, "the docs have their TOML snippets");
    for snippet in snippets {
        let dir = tempfile::tempdir().expect("tempdir");
        let text_with_files = make_named_files(&snippet.text, dir.path());
        let path = dir.path().join("delayq.toml");
        std::fs::write(&path, &text_with_files).expect("write the snippet");
        let out = Command::new(delayq_bin())
            .args(["check-config", "--config", path.to_str().expect("utf-8")])
            // No DELAYQ_* override of the test's environment: the snippet alone.
            .env_clear()
            .env("CREDENTIALS_DIRECTORY", dir.path().join("credentials"))
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .output()
            .expect("run delayq check-config");
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}: check-config refused the snippet: {}\n{}",
            snippet.line,
            text(&out.stderr),
            snippet.text
        );
    }
}

/// One `curl` of the docs: method, path, whether it sends the token, body, and
/// the status its comment shows (None: any success).
#[derive(Debug)]
struct Curl {
    line: Place,
    method: String,
    path: String,
    token: bool,
    body: Option<String>,
    status: Option<u16>,
}

/// A command of a shell block: its line, its text with continued lines joined, and
/// the status the comment lines right after it end with, if any.
struct ShellCommand {
    line: Place,
    text: String,
    status: Option<u16>,
}

/// The commands of the docs' shell blocks, README.md's first.
fn shell_commands() -> Vec<ShellCommand> {
    let mut found = Vec::new();
    for block in blocks_of("sh") {
        let lines: Vec<&str> = block.text.lines().collect();
        let mut i = 0;
        while i < lines.len() {
            if lines[i].trim_start().starts_with('#') || lines[i].trim().is_empty() {
                i += 1;
                continue;
            }
            let start = i;
            let mut command = String::new();
            // Until the quotes close and no line ends with a backslash.
            loop {
                let line = lines[i];
                command += line.trim_end().trim_end_matches('\\');
                command.push('\n');
                i += 1;
                let unbalanced = command.matches('\'').count() % 2 == 1;
                if (!unbalanced && !line.trim_end().ends_with('\\')) || i == lines.len() {
                    break;
                }
            }
            // The comment lines right after it; the last may end with the status.
            let mut status = None;
            while i < lines.len() && lines[i].trim_start().starts_with('#') {
                status = lines[i]
                    .trim_end()
                    .rsplit(' ')
                    .next()
                    .and_then(|s| s.parse::<u16>().ok())
                    .filter(|s| (100..600).contains(s));
                i += 1;
            }
            found.push(ShellCommand {
                line: block.line + start,
                text: command.trim().to_owned(),
                status,
            });
        }
    }
    found
}

/// The text of a command as a shell passes it on: a trailing `  # comment` cut off.
fn without_comment(command: &str) -> String {
    command
        .lines()
        .map(|l| match l.find("  #") {
            Some(at) if l[..at].matches('\'').count() % 2 == 0 => &l[..at],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The curl commands of the docs' shell blocks, in the order they are read.
fn curls() -> Vec<Curl> {
    shell_commands()
        .into_iter()
        .filter(|c| c.text.starts_with("curl "))
        .map(|c| parse_curl(c.line, &c.text, c.status))
        .collect()
}

fn parse_curl(line: Place, command: &str, status: Option<u16>) -> Curl {
    let words = shlex::split(&without_comment(command))
        .unwrap_or_else(|| panic!("{line}: curl not in shell words"));
    let mut curl = Curl {
        line,
        method: String::new(),
        path: String::new(),
        token: false,
        body: None,
        status,
    };
    let mut words = words.into_iter().skip(1);
    while let Some(word) = words.next() {
        match word.as_str() {
            "-X" => curl.method = words.next().expect("a method"),
            "-d" => curl.body = words.next(),
            "-H" => {
                curl.token |= words
                    .next()
                    .is_some_and(|h| h.starts_with("Authorization: Bearer"))
            }
            "-w" => {
                words.next();
            }
            flag if flag.starts_with('-') => {}
            url => {
                let at = url
                    .find('/')
                    .unwrap_or_else(|| panic!("line {line}: {url}: no path"));
                curl.path = url[at..].to_owned();
            }
        }
    }
    if curl.method.is_empty() {
        curl.method = if curl.body.is_some() { "POST" } else { "GET" }.to_owned();
    }
    curl
}

#[tokio::test]
async fn every_curl_example_answers_as_the_readme_shows() {
    const TOKEN: &str = "readme-token";
    // As the README's examples assume: only "orders" allowed (the batch example's
    // "payroll" is refused), on loopback; a token the examples that send one send.
    let env = Env::start("[streams]\nallow = [\"orders\"]\n").await;
    env.leading().await;
    let curls = curls();
    assert!(
        curls.len() >= 10,
        "the docs have their curl examples: {curls:?}"
    );
    // The id the README's examples use stands for the last one pushed.
    let example_id = "01M80K2AE02CJQBD3JZ9KCS0JC";
    let mut last_id: Option<String> = None;
    for curl in &curls {
        let path = match &last_id {
            Some(id) => curl.path.replace(example_id, id),
            None => curl.path.clone(),
        };
        let token = curl.token.then_some(TOKEN);
        let (status, answer) = env
            .api
            .call(&curl.method, &path, token, curl.body.as_deref())
            .await;
        if let Some(id) = answer["id"].as_str().filter(|_| status == 201) {
            last_id = Some(id.to_owned());
        }
        let restore = path.starts_with("/v1/admin/restore");
        match curl.status {
            Some(want) => assert_eq!(status, want, "{}: {curl:?}: {answer}", curl.line),
            // Restoring needs a journal, which this daemon has not: it reads the body
            // first, so a 409 no_journal says the body was taken.
            None if restore => assert_eq!(
                (status, answer["error"].as_str()),
                (409, Some("no_journal")),
                "{}: {curl:?}: {answer}",
                curl.line
            ),
            None => assert!(
                (200..300).contains(&status),
                "{}: {curl:?} answered {status} {answer}",
                curl.line
            ),
        }
        if path.ends_with("/batch") {
            assert_eq!(answer["scheduled"], 1, "line {}: {answer}", curl.line);
            assert_eq!(
                answer["results"][1]["status"], 403,
                "line {}: {answer}",
                curl.line
            );
        }
    }
    let cancelled = curls.iter().any(|c| c.method == "DELETE");
    assert!(
        cancelled && last_id.is_some(),
        "the examples push and cancel"
    );
}

#[test]
fn the_rust_client_example_is_the_compiled_one() {
    let example =
        std::fs::read_to_string(repo().join("client/examples/producer.rs")).expect("read");
    let shown = blocks_of("rust");
    assert_eq!(shown.len(), 1, "one Rust example in the docs");
    assert_eq!(
        shown[0].text, example,
        "the Rust example of {} is client/examples/producer.rs",
        shown[0].line
    );
    assert!(example.contains("async fn main()"), "a whole program");
}

/// Every `delayq ...` line of the docs' shell blocks names a subcommand and
/// options that exist: `--help` after its words parses only if they do.
#[test]
fn every_delayq_command_line_parses() {
    let mut checked = 0;
    for command in shell_commands() {
        let text_line = without_comment(&command.text);
        let Some(rest) = text_line
            .strip_prefix("delayq ")
            .or_else(|| text_line.strip_prefix("./target/release/delayq "))
        else {
            continue;
        };
        let line = command.line;
        let rest = rest.split(';').next().unwrap_or(rest);
        let words = shlex::split(rest).unwrap_or_else(|| panic!("{line}: {rest}: not shell words"));
        // Everything up to the first option: the subcommand path; `--help` there
        // checks it exists, and its help text lists the options it takes.
        let sub: Vec<&str> = words
            .iter()
            .take_while(|w| !w.starts_with('-'))
            .map(String::as_str)
            .take(2)
            .collect();
        let help = Command::new(delayq_bin())
            .args(&sub)
            .arg("--help")
            .output()
            .expect("run delayq --help");
        let help_text = text(&help.stdout);
        assert!(
            help.status.success(),
            "{line}: {rest}: {}",
            text(&help.stderr)
        );
        for option in words.iter().filter(|w| w.starts_with("--")) {
            let name = option.split('=').next().unwrap_or(option);
            assert!(
                name == "--help"
                    || help_text.contains(&format!("{name} "))
                    || help_text.contains(&format!("{name}\n")),
                "{line}: {rest}: {name} is not an option of `delayq {}`",
                sub.join(" ")
            );
        }
        checked += 1;
    }
    assert!(
        checked >= 10,
        "the docs show delayq command lines ({checked})"
    );
}

#[test]
fn the_blocks_parser_reads_indented_blocks() {
    let found = blocks(
        "x.md",
        "text\n  ```sh\n  curl x\n    more\n  ```\n```toml\na = 1\n```\n",
    );
    let shown: Vec<(&str, usize, &str)> = found
        .iter()
        .map(|b| (b.lang.as_str(), b.line.line, b.text.as_str()))
        .collect();
    assert_eq!(
        shown,
        [("sh", 3, "curl x\n  more\n"), ("toml", 7, "a = 1\n")]
    );
    let curl = parse_curl(
        Place {
            file: "x.md",
            line: 1,
        },
        "curl -w ' %{http_code}\\n' -X POST localhost:7070/v1/x -d '{\"a\":1}'   # note\n",
        Some(201),
    );
    assert_eq!(
        (
            curl.method.as_str(),
            curl.path.as_str(),
            curl.body.as_deref()
        ),
        ("POST", "/v1/x", Some("{\"a\":1}"))
    );
}

/// The anchor a Markdown heading (`## Its words`) gets: lower case, spaces as
/// hyphens, and only letters, digits, hyphens and underscores kept.
fn anchor(heading: &str) -> String {
    heading
        .trim_start_matches('#')
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a document's headings (outside code blocks).
fn anchors(text: &str) -> Vec<String> {
    let mut in_code = false;
    let mut found = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            found.push(anchor(line));
        }
    }
    found
}

/// The relative links of a document's text outside code blocks: (line, target).
fn relative_links(text: &str) -> Vec<(usize, String)> {
    let mut in_code = false;
    let mut found = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = &after[..end];
            if !target.contains("://") && !target.starts_with("mailto:") && !target.is_empty() {
                found.push((i + 1, target.to_owned()));
            }
            rest = &after[end..];
        }
    }
    found
}

/// Every relative link of the docs names a file of the repository, from the
/// document's own folder, and an anchor names a heading of the file it points into.
#[test]
fn every_relative_link_names_a_file_that_exists() {
    let documents = documents();
    let mut checked = 0;
    for (file, text) in &documents {
        let folder = repo().join(file).parent().expect("a folder").to_path_buf();
        for (line, target) in relative_links(text) {
            let place = Place { file, line };
            let (path, fragment) = target.split_once('#').unwrap_or((&target, ""));
            let linked = if path.is_empty() {
                repo().join(file)
            } else {
                folder.join(path)
            };
            assert!(linked.exists(), "{place}: {target}: no such file");
            if !fragment.is_empty() {
                let linked_text = std::fs::read_to_string(&linked)
                    .unwrap_or_else(|e| panic!("{place}: {target}: {e}"));
                assert!(
                    anchors(&linked_text).iter().any(|a| a == fragment),
                    "{place}: {target}: no heading has the anchor #{fragment}"
                );
            }
            checked += 1;
        }
    }
    assert!(
        checked >= 20,
        "the docs link to each other ({checked} links)"
    );
    assert_eq!(anchor("## Failover drills"), "failover-drills");
    assert_eq!(
        relative_links("a [b](docs/x.md#y) c ![d](e.png)\n```\n[f](g)\n```\n"),
        [(1, "docs/x.md#y".to_owned()), (1, "e.png".to_owned())]
    );
}

/// The rows of the key reference in docs/configuration.md: (key, default cell,
/// reload cell), in order.
fn documented_keys() -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string(repo().join("docs/configuration.md")).expect("read");
    let reference = &text[text.find("## Every key").expect("a key reference")..];
    reference
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split(" | ").map(str::trim).collect();
            assert!(cells.len() >= 4, "a row of four cells: {l}");
            (
                cells[0].trim_matches('`').to_owned(),
                cells[1].to_owned(),
                cells[2].to_owned(),
            )
        })
        .collect()
}

/// Every key of the configuration, as its types give it with no file and no
/// environment (`section.key` -> value), tables of streams left out.
fn default_keys() -> Vec<(String, toml::Value)> {
    fn flatten(prefix: &str, table: &toml::Table, out: &mut Vec<(String, toml::Value)>) {
        for (key, value) in table {
            let name = format!("{prefix}{key}");
            match value {
                toml::Value::Table(inner) => flatten(&format!("{name}."), inner, out),
                other => out.push((name, other.clone())),
            }
        }
    }
    let (_, effective) =
        delayq_client::config::Config::effective("", Vec::<(String, String)>::new())
            .expect("defaults");
    let mut keys = Vec::new();
    flatten("", &effective, &mut keys);
    keys
}

/// docs/configuration.md documents every key the configuration types know, with its
/// default as they set it and whether a reload applies it as the reloader decides.
#[test]
fn every_configuration_key_is_documented_with_its_default_and_reload() {
    let documented = documented_keys();
    let defaults = default_keys();
    assert!(defaults.len() >= 50, "the defaults: {defaults:?}");
    for (key, value) in &defaults {
        let row = documented.iter().find(|(k, _, _)| k == key);
        let Some((_, default, _)) = row else {
            panic!("docs/configuration.md: {key} (default {value}) has no row in \"Every key\"");
        };
        // node.id is made at start from the host's name and the process id.
        if key != "node.id" {
            assert_eq!(
                default,
                &format!("`{value}`"),
                "docs/configuration.md: {key}: the default the configuration sets"
            );
        }
    }
    for (key, default, reload) in &documented {
        let want = if delayq::reload::is_reloadable(key) {
            "SIGHUP"
        } else {
            "restart"
        };
        assert_eq!(
            reload, want,
            "docs/configuration.md: {key}: whether a reload applies it"
        );
        if !key.contains('<') && default != "unset" {
            assert!(
                defaults.iter().any(|(k, _)| k == key),
                "docs/configuration.md: {key} has default {default} but the configuration has no such key"
            );
        }
    }
}

/// CI runs the suite exactly as the README tells a newcomer to.
#[test]
fn ci_runs_the_readmes_test_command() {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let ci = std::fs::read_to_string(repo().join(".ci/run")).expect(".ci/run");
    let command = readme
        .lines()
        .find(|l| l.starts_with(".ci/install-deps --tests &&"))
        .expect("the README's test command");
    assert_eq!(
        ci.lines().rfind(|l| !l.starts_with('#')),
        Some(command),
        ".ci/run ends with the README's test command"
    );
}
