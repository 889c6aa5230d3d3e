//! The value list of a node selector requirement, shared between the objects that list the same
//! values.
//!
//! A NodeClaim lists the instance types it may launch as, up to 600 names, and the NodeClaims a
//! provisioning pass makes for one NodePool mostly list the same ones: held as a `Vec<String>`
//! each, those names were most of what the NodeClaim cache held (about 21 KB per NodeClaim at
//! 2,000 nodes). A long list read from JSON is interned, so every object with the same list
//! points at one copy; lists that no object holds any more are dropped from the interner as it
//! grows.

use std::collections::HashSet;
use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Lists shorter than this are not interned: they cost little, and most are distinct.
const INTERN_FROM: usize = 8;

/// The values of a requirement: a list of strings shared between copies (cloning is a reference
/// count), read and written as a JSON array. Read it as a slice; build a new one to change it.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Values(Arc<[String]>);

impl Values {
    /// Whether two lists are the same allocation (interned lists with the same values are).
    pub fn ptr_eq(a: &Values, b: &Values) -> bool {
        Arc::ptr_eq(&a.0, &b.0)
    }
}

impl Deref for Values {
    type Target = [String];
    fn deref(&self) -> &[String] {
        &self.0
    }
}

impl fmt::Debug for Values {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.iter()).finish()
    }
}

impl From<Vec<String>> for Values {
    fn from(values: Vec<String>) -> Self {
        Values(intern(values))
    }
}

impl<const N: usize> From<[&str; N]> for Values {
    fn from(values: [&str; N]) -> Self {
        values.into_iter().map(str::to_string).collect()
    }
}

impl FromIterator<String> for Values {
    fn from_iter<I: IntoIterator<Item = String>>(iter: I) -> Self {
        Values::from(iter.into_iter().collect::<Vec<_>>())
    }
}

impl<'a> IntoIterator for &'a Values {
    type Item = &'a String;
    type IntoIter = std::slice::Iter<'a, String>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl PartialEq<Vec<String>> for Values {
    fn eq(&self, other: &Vec<String>) -> bool {
        *self.0 == **other
    }
}

impl<const N: usize> PartialEq<[&str; N]> for Values {
    fn eq(&self, other: &[&str; N]) -> bool {
        self.0.len() == N && self.0.iter().zip(other).all(|(a, b)| a == b)
    }
}

impl Serialize for Values {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Values {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Vec::<String>::deserialize(deserializer).map(Values::from)
    }
}

impl JsonSchema for Values {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> std::borrow::Cow<'static, str> {
        <Vec<String>>::schema_name()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        <Vec<String>>::json_schema(generator)
    }
}

/// The long lists some object holds, each once.
struct Interner {
    lists: HashSet<Arc<[String]>>,
    /// When the set reaches this size, lists no object holds are dropped first.
    sweep_at: usize,
}

static INTERNER: LazyLock<Mutex<Interner>> =
    LazyLock::new(|| Mutex::new(Interner { lists: HashSet::new(), sweep_at: 64 }));

/// The shared copy of `values`: the one already interned when a list with the same values is,
/// else `values` (interned if long).
fn intern(values: Vec<String>) -> Arc<[String]> {
    if values.len() < INTERN_FROM {
        return values.into();
    }
    // A panic elsewhere while the lock was held leaves the set whole: keep using it.
    let mut interner = INTERNER.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(shared) = interner.lists.get(values.as_slice()) {
        return Arc::clone(shared);
    }
    if interner.lists.len() >= interner.sweep_at {
        interner.lists.retain(|list| Arc::strong_count(list) > 1);
        interner.sweep_at = (interner.lists.len() * 2).max(64);
    }
    let shared: Arc<[String]> = values.into();
    interner.lists.insert(Arc::clone(&shared));
    shared
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(prefix: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{prefix}{i}")).collect()
    }

    #[test]
    fn long_lists_with_the_same_values_share_one_copy() -> Result<(), serde_json::Error> {
        let json = serde_json::to_string(&names("shared-type-", 600))?;
        let a: Values = serde_json::from_str(&json)?;
        let b: Values = serde_json::from_str(&json)?;
        assert!(Values::ptr_eq(&a, &b), "read twice, held once");
        assert_eq!(a.len(), 600);
        assert_eq!(serde_json::to_string(&a)?, json, "written as read");
        let other: Values = names("other-type-", 600).into();
        assert!(!Values::ptr_eq(&a, &other));
        assert_ne!(a, other);
        Ok(())
    }

    #[test]
    fn short_lists_are_not_interned() {
        let a = Values::from(["a", "b"]);
        let b = Values::from(["a", "b"]);
        assert_eq!(a, b);
        assert!(!Values::ptr_eq(&a, &b));
    }

    #[test]
    fn lists_no_object_holds_are_swept_as_the_interner_grows() {
        let kept: Values = names("kept-", 10).into();
        for round in 0..300 {
            drop(Values::from(names(&format!("dropped-{round}-"), 10)));
        }
        let interner = INTERNER.lock().unwrap_or_else(PoisonError::into_inner);
        assert!(interner.lists.len() < 200, "{} lists held", interner.lists.len());
        assert!(interner.lists.contains(&kept[..]), "a list still held stays");
    }
}
