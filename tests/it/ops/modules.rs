//! The shape of the source: no module of `src/`, `client/src/` or `harness/src/`
//! uses a sibling that uses it back, however long the way round (a circle), and
//! no file is over 600 lines.
//!
//! Each file is a module; a path in it that starts with `crate`, `super` or `self`
//! (in a `use` or anywhere in the code) names the module it reaches. A use between
//! two modules counts as one between their ancestors that are siblings (`api/input`
//! using `api/streams/poll` is `input` → `streams` under `api`); a module using its
//! own parent or child is not a circle. Paths written inside macro calls are not
//! read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// The crates' source folders, from the workspace root.
const ROOTS: [&str; 3] = ["src", "client/src", "harness/src"];

/// The longest a file of `src/` may be.
const MAX_LINES: usize = 600;

/// A module: its path under its crate's root (`["api", "input"]`); the root is `[]`.
type Module = Vec<String>;

/// Every `.rs` file under `dir`, by its module.
fn modules(dir: &Path) -> BTreeMap<Module, PathBuf> {
    fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("read a source folder") {
            let path = entry.expect("a folder entry").path();
            if path.is_dir() {
                walk(&path, files);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(dir, &mut files);
    files
        .into_iter()
        .map(|file| {
            let relative = file.strip_prefix(dir).expect("under its root");
            let mut module: Module = relative
                .with_extension("")
                .iter()
                .map(|part| part.to_string_lossy().into_owned())
                .collect();
            if matches!(
                module.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                module.pop();
            }
            (module, file)
        })
        .collect()
}

/// The paths of one file that start with `crate`, `super` or `self`, each as the
/// module path it names, resolved from where it is written.
struct Paths<'a> {
    /// The file's module, then the inline modules (`mod tests { .. }`) entered.
    at: Module,
    found: &'a mut Vec<Module>,
}

impl Paths<'_> {
    fn resolve(&mut self, segments: &[String]) {
        let mut module = self.at.clone();
        let mut rest = segments;
        match rest.first().map(String::as_str) {
            Some("crate") => {
                module.clear();
                rest = &rest[1..];
            }
            Some("self") => rest = &rest[1..],
            Some("super") => {
                while rest.first().map(String::as_str) == Some("super") {
                    module.pop();
                    rest = &rest[1..];
                }
            }
            _ => return,
        }
        module.extend(rest.iter().cloned());
        self.found.push(module);
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                prefix.push(n.ident.to_string());
                self.resolve(prefix);
                prefix.pop();
            }
            syn::UseTree::Rename(r) => {
                prefix.push(r.ident.to_string());
                self.resolve(prefix);
                prefix.pop();
            }
            syn::UseTree::Glob(_) => self.resolve(prefix),
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for Paths<'_> {
    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if item.content.is_some() {
            self.at.push(item.ident.to_string());
            syn::visit::visit_item_mod(self, item);
            self.at.pop();
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &item.tree);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        self.resolve(&segments);
        syn::visit::visit_path(self, path);
    }
}

/// The uses between sibling modules of one crate: (from, to) → the file and path
/// that show it.
fn sibling_uses(root: &Path) -> BTreeMap<(Module, Module), String> {
    let modules = modules(root);
    let mut uses = BTreeMap::new();
    for (module, file) in &modules {
        let text = std::fs::read_to_string(file).expect("read a source file");
        let syntax = syn::parse_file(&text)
            .unwrap_or_else(|e| panic!("{} does not parse: {e}", file.display()));
        let mut found = Vec::new();
        Paths {
            at: module.clone(),
            found: &mut found,
        }
        .visit_file(&syntax);
        for named in found {
            // The module the path reaches: its longest prefix that is a file's.
            let Some(target) = (0..=named.len())
                .rev()
                .map(|n| named[..n].to_vec())
                .find(|m| modules.contains_key(m))
            else {
                continue;
            };
            let common = module
                .iter()
                .zip(&target)
                .take_while(|(a, b)| a == b)
                .count();
            if common == module.len() || common == target.len() {
                continue; // itself, an ancestor or a descendant
            }
            let from = module[..=common].to_vec();
            let to = target[..=common].to_vec();
            uses.entry((from, to))
                .or_insert_with(|| format!("{} names {}", file.display(), named.join("::")));
        }
    }
    uses
}

/// The circles among `uses`: each strongly connected set of two or more modules.
fn circles(uses: &BTreeMap<(Module, Module), String>) -> Vec<BTreeSet<Module>> {
    let mut next: BTreeMap<&Module, Vec<&Module>> = BTreeMap::new();
    for (from, to) in uses.keys() {
        next.entry(from).or_default().push(to);
    }
    let reach = |start: &Module| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![start];
        while let Some(m) = todo.pop() {
            for &n in next.get(m).into_iter().flatten() {
                if seen.insert(n.clone()) {
                    todo.push(n);
                }
            }
        }
        seen
    };
    let nodes: BTreeSet<&Module> = uses.keys().flat_map(|(a, b)| [a, b]).collect();
    let reached: BTreeMap<&Module, BTreeSet<Module>> =
        nodes.iter().map(|&m| (m, reach(m))).collect();
    let mut found: Vec<BTreeSet<Module>> = Vec::new();
    for &m in &nodes {
        if !reached[m].contains(m) || found.iter().any(|c| c.contains(m)) {
            continue;
        }
        let circle = nodes
            .iter()
            .filter(|&&n| reached[m].contains(n) && reached[n].contains(m))
            .map(|&n| n.clone())
            .collect();
        found.push(circle);
    }
    found
}

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn no_module_uses_a_sibling_that_uses_it_back() {
    let mut report = String::new();
    let mut modules_seen = 0;
    for root in ROOTS {
        let root = workspace().join(root);
        modules_seen += modules(&root).len();
        let uses = sibling_uses(&root);
        for circle in circles(&uses) {
            report.push_str(&format!("a circle in {}:\n", root.display()));
            for ((from, to), shown) in &uses {
                if circle.contains(from) && circle.contains(to) {
                    report.push_str(&format!(
                        "  {} -> {}: {shown}\n",
                        from.join("/"),
                        to.join("/")
                    ));
                }
            }
        }
    }
    assert!(modules_seen > 150, "only {modules_seen} modules read");
    assert!(report.is_empty(), "{report}");
}

#[test]
fn a_circle_is_found_however_long_the_way_round() {
    let m = |path: &str| -> Module { path.split('/').map(str::to_owned).collect() };
    let uses: BTreeMap<(Module, Module), String> = [
        (("a/x", "a/y"), ""),
        (("a/y", "a/z"), ""),
        (("a/z", "a/x"), ""),
        (("b", "a"), ""),
        (("a/x", "a/w"), ""),
    ]
    .into_iter()
    .map(|((from, to), shown)| ((m(from), m(to)), shown.to_owned()))
    .collect();
    let found = circles(&uses);
    assert_eq!(found, vec![BTreeSet::from([m("a/x"), m("a/y"), m("a/z")])]);
}

#[test]
fn no_file_of_the_daemon_is_over_600_lines() {
    let mut long = Vec::new();
    for root in ROOTS {
        for file in modules(&workspace().join(root)).into_values() {
            let lines = std::fs::read_to_string(&file)
                .expect("read")
                .lines()
                .count();
            if lines > MAX_LINES {
                long.push(format!("{}: {lines} lines", file.display()));
            }
        }
    }
    assert!(long.is_empty(), "over {MAX_LINES} lines: {long:?}");
}
