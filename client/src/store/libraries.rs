//! The function libraries of delayq that Redis holds: this build's, and those
//! that builds of other versions loaded before (each version's library carries
//! the hash of its text in its name, so an upgrade loads a library beside the
//! old one, which stays until removed). Removing a library is always safe: a
//! node still running that version loads it again at its next call.

use std::collections::HashMap;

use redis::Value;

use super::{Result, Store, StoreError, scripts};

/// What one Redis master holds of delayq's libraries.
#[derive(Clone, Debug)]
pub struct NodeLibraries {
    /// The master's address ("host:port") on Redis Cluster; `None` on one Redis.
    pub node: Option<String>,
    /// delayq's libraries there, by name.
    pub libraries: Vec<Library>,
    /// What every function library there takes (`INFO memory`):
    /// `used_memory_vm_functions` (the Lua engine) and `used_memory_functions`.
    pub lua_bytes: u64,
    pub bytes: u64,
}

/// One library of delayq's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Library {
    pub name: String,
    /// How many functions it registers.
    pub functions: usize,
    /// Whether it is this build's library.
    pub current: bool,
}

impl Store {
    /// The name of this build's function library.
    pub fn library_name() -> &'static str {
        scripts::library_name()
    }

    /// delayq's function libraries on every master, with what functions take there.
    pub async fn function_libraries(&self) -> Result<Vec<NodeLibraries>> {
        let mut list = redis::cmd("FUNCTION");
        list.arg("LIST").arg("LIBRARYNAME").arg("delayq_*");
        let lists = self.conn.on_every_master(list).await?;
        let mut info = redis::cmd("INFO");
        info.arg("memory");
        let memory = self.conn.on_every_master(info).await?;
        let mut nodes = Vec::with_capacity(lists.len());
        for (node, reply) in lists {
            let info = memory
                .iter()
                .find(|(n, _)| *n == node)
                .map(|(_, info)| super::text(info))
                .transpose()?
                .unwrap_or_default();
            let mut libraries = libraries_in(reply)?;
            libraries.sort_by(|a, b| (!a.current, &a.name).cmp(&(!b.current, &b.name)));
            nodes.push(NodeLibraries {
                node,
                libraries,
                lua_bytes: info_field(&info, "used_memory_vm_functions"),
                bytes: info_field(&info, "used_memory_functions"),
            });
        }
        nodes.sort_by(|a, b| a.node.cmp(&b.node));
        Ok(nodes)
    }

    /// Removes library `name` from `node` (as [`NodeLibraries`] names it); false
    /// if it was not there (removed meanwhile).
    pub async fn delete_library(&self, node: Option<&str>, name: &str) -> Result<bool> {
        let mut delete = redis::cmd("FUNCTION");
        delete.arg("DELETE").arg(name);
        match self.conn.on_node(node, delete).await {
            Ok(_) => Ok(true),
            Err(e) if e.to_string().contains("Library not found") => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

/// delayq's libraries in a `FUNCTION LIST` reply, others left out.
fn libraries_in(reply: Value) -> Result<Vec<Library>> {
    let listed: Vec<HashMap<String, Value>> = redis::from_redis_value(reply)
        .map_err(|e| StoreError::Reply(format!("FUNCTION LIST: {e}")))?;
    let mut libraries = Vec::new();
    for library in listed {
        let Some(name) = library.get("library_name").map(super::text).transpose()? else {
            continue;
        };
        if !scripts::is_library_name(&name) {
            continue;
        }
        let functions = match library.get("functions") {
            Some(Value::Array(functions)) => functions.len(),
            _ => 0,
        };
        libraries.push(Library {
            current: name == scripts::library_name(),
            name,
            functions,
        });
    }
    Ok(libraries)
}

/// A `field:value` line's value in an `INFO` text.
pub fn info_value<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .map(str::trim)
}

/// A number field of an `INFO` text; 0 when missing.
fn info_field(info: &str, field: &str) -> u64 {
    info_value(info, field)
        .and_then(|value| value.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_fields_are_read_by_their_exact_name() {
        let info = "# Memory\r\nused_memory_vm_functions:33792\r\nused_memory_functions:200\r\n";
        assert_eq!(info_field(info, "used_memory_vm_functions"), 33792);
        assert_eq!(info_field(info, "used_memory_functions"), 200);
        assert_eq!(info_field(info, "used_memory_vm"), 0);
        assert_eq!(info_field(info, "missing"), 0);
    }
}
