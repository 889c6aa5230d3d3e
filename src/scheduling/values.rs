//! Compact sorted sets of label values.
//!
//! A [`ValueSet`] is what a [`Requirement`](super::Requirement) lists: most hold a single value
//! (an instance type's `kubernetes.io/arch`, its size, its memory), a few hold a handful (zones,
//! capacity types), so the set is a sorted slice with the empty set and a single value stored
//! without an allocation of their own. A larger set is shared by its copies: the NodeClaims of a
//! pass mostly list the same hundreds of instance types.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// A sorted set of label values without duplicates; iteration is in sorted order.
#[derive(Clone, Default)]
pub struct ValueSet(Repr);

#[derive(Clone, Default)]
enum Repr {
    #[default]
    Empty,
    One(Box<str>),
    /// At least two values, sorted and distinct; shared by the set's copies.
    Many(Arc<[Box<str>]>),
}

impl ValueSet {
    /// The empty set.
    pub fn new() -> Self {
        ValueSet(Repr::Empty)
    }

    /// The set of `values`, in any order and possibly repeated.
    pub fn from_values(values: impl IntoIterator<Item = Box<str>>) -> Self {
        let mut v: Vec<Box<str>> = values.into_iter().collect();
        v.sort_unstable();
        v.dedup();
        ValueSet::from_sorted(v)
    }

    /// The set of `values`, which are sorted and distinct.
    fn from_sorted(mut values: Vec<Box<str>>) -> Self {
        match values.len() {
            0 => ValueSet(Repr::Empty),
            1 => ValueSet(values.pop().map_or(Repr::Empty, Repr::One)),
            _ => ValueSet(Repr::Many(values.into())),
        }
    }

    /// The values, sorted.
    pub fn as_slice(&self) -> &[Box<str>] {
        match &self.0 {
            Repr::Empty => &[],
            Repr::One(v) => std::slice::from_ref(v),
            Repr::Many(vs) => vs,
        }
    }

    /// The values in sorted order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &str> + ExactSizeIterator + Clone {
        self.as_slice().iter().map(|v| &**v)
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// Whether there is no value.
    pub fn is_empty(&self) -> bool {
        matches!(self.0, Repr::Empty)
    }

    /// Whether `value` is in the set.
    pub fn contains(&self, value: &str) -> bool {
        match &self.0 {
            Repr::Empty => false,
            Repr::One(v) => **v == *value,
            Repr::Many(vs) => vs.binary_search_by(|v| (**v).cmp(value)).is_ok(),
        }
    }

    /// The smallest value.
    pub fn first(&self) -> Option<&str> {
        self.as_slice().first().map(|v| &**v)
    }

    /// The values in either set.
    pub fn union(&self, other: &ValueSet) -> ValueSet {
        merge(self, other, Keep { left: true, both: true, right: true })
    }

    /// The values in both sets.
    pub fn intersection(&self, other: &ValueSet) -> ValueSet {
        merge(self, other, Keep { left: false, both: true, right: false })
    }

    /// The values in `self` but not in `other`.
    pub fn difference(&self, other: &ValueSet) -> ValueSet {
        merge(self, other, Keep { left: true, both: false, right: false })
    }

    /// Keeps the values `keep` accepts.
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        if self.iter().all(&mut keep) {
            return;
        }
        let kept: Vec<Box<str>> = self.as_slice().iter().filter(|v| keep(v)).cloned().collect();
        *self = ValueSet::from_sorted(kept);
    }
}

/// Which values a merge of two sorted sets keeps: those only on the left, on both sides, or only
/// on the right.
struct Keep {
    left: bool,
    both: bool,
    right: bool,
}

fn merge(left: &ValueSet, right: &ValueSet, keep: Keep) -> ValueSet {
    let (a, b) = (left.as_slice(), right.as_slice());
    let mut out = Vec::new();
    let (mut i, mut j) = (0, 0);
    while let (Some(x), Some(y)) = (a.get(i), b.get(j)) {
        match x.cmp(y) {
            Ordering::Less => {
                if keep.left {
                    out.push(x.clone());
                }
                i += 1;
            }
            Ordering::Greater => {
                if keep.right {
                    out.push(y.clone());
                }
                j += 1;
            }
            Ordering::Equal => {
                if keep.both {
                    out.push(x.clone());
                }
                i += 1;
                j += 1;
            }
        }
    }
    if keep.left {
        out.extend(a.iter().skip(i).cloned());
    }
    if keep.right {
        out.extend(b.iter().skip(j).cloned());
    }
    // A result equal to an operand is that operand, shared rather than a copy of it. Union,
    // intersection and difference each give a set within `left` or holding all of it, so the same
    // size means the same set; union and intersection likewise for `right`.
    if out.len() == a.len() {
        return left.clone();
    }
    if keep.both && out.len() == b.len() {
        return right.clone();
    }
    ValueSet::from_sorted(out)
}

impl PartialEq for ValueSet {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for ValueSet {}

impl Hash for ValueSet {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_slice().hash(state);
    }
}

impl PartialOrd for ValueSet {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ValueSet {
    fn cmp(&self, other: &Self) -> Ordering {
        self.as_slice().cmp(other.as_slice())
    }
}

impl fmt::Debug for ValueSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl<'a> IntoIterator for &'a ValueSet {
    type Item = &'a str;
    type IntoIter = std::iter::Map<std::slice::Iter<'a, Box<str>>, fn(&'a Box<str>) -> &'a str>;

    fn into_iter(self) -> Self::IntoIter {
        self.as_slice().iter().map(|v| &**v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn set(values: &[&str]) -> ValueSet {
        ValueSet::from_values(values.iter().map(|v| Box::from(*v)))
    }

    fn btree(values: &[&str]) -> BTreeSet<String> {
        values.iter().map(|v| v.to_string()).collect()
    }

    fn same(s: &ValueSet, b: &BTreeSet<String>) -> bool {
        s.iter().eq(b.iter().map(String::as_str))
    }

    #[test]
    fn behaves_as_a_sorted_set() {
        let cases: [&[&str]; 6] =
            [&[], &["a"], &["b", "a", "b"], &["c", "a"], &["a", "d", "e"], &["x", "y", "z", "a"]];
        for a in cases {
            let (sa, ba) = (set(a), btree(a));
            assert!(same(&sa, &ba), "{sa:?}");
            assert_eq!(sa.len(), ba.len());
            assert_eq!(sa.is_empty(), ba.is_empty());
            assert_eq!(sa.first(), ba.first().map(String::as_str));
            for v in ["a", "b", "c", "q"] {
                assert_eq!(sa.contains(v), ba.contains(v), "{v} in {sa:?}");
            }
            for b in cases {
                let (sb, bb) = (set(b), btree(b));
                assert!(same(&sa.union(&sb), &ba.union(&bb).cloned().collect()));
                assert!(same(&sa.intersection(&sb), &ba.intersection(&bb).cloned().collect()));
                assert!(same(&sa.difference(&sb), &ba.difference(&bb).cloned().collect()));
                assert_eq!(sa == sb, ba == bb);
                assert_eq!(sa.cmp(&sb), ba.iter().cmp(bb.iter()));
            }
            let mut kept = sa.clone();
            kept.retain(|v| v != "a");
            assert_eq!(kept, set(&a.iter().copied().filter(|v| *v != "a").collect::<Vec<_>>()));
        }
        assert_eq!(format!("{:?}", set(&["b", "a"])), format!("{:?}", btree(&["b", "a"])));
    }

    #[test]
    fn copies_and_results_equal_to_an_operand_share_its_values() {
        let shared = |a: &ValueSet, b: &ValueSet| std::ptr::eq(a.as_slice(), b.as_slice());
        let types = set(&["c5.large", "m5.large", "m5.xlarge", "r5.large"]);
        assert!(shared(&types, &types.clone()));
        let wider = set(&["c5.large", "m5.large", "m5.xlarge", "r5.large", "t3.large"]);
        assert!(shared(&types.intersection(&wider), &types), "nothing left out: the same set");
        assert!(shared(&wider.intersection(&types), &types));
        assert!(shared(&types.union(&set(&["m5.large", "r5.large"])), &types));
        assert!(shared(&types.difference(&set(&["t3.large", "x1.large"])), &types));
        let narrower = types.intersection(&set(&["m5.large", "r5.large", "z"]));
        assert_eq!(narrower, set(&["m5.large", "r5.large"]));
        assert!(!shared(&narrower, &types));
        assert!(types.difference(&types).is_empty(), "a difference the size of `right` is not `right`");
    }
}
