//! The hash of `github.com/mitchellh/hashstructure/v2` (`Hash` in `FormatV2`), which upstream
//! Karpenter writes in the `karpenter.sh/nodepool-hash` and `karpenter.k8s.aws/ec2nodeclass-hash`
//! annotations, over Go values described as a [`Value`] tree.
//!
//! The library walks a Go value by reflection; here the caller builds the tree the walk would
//! see (see [`super::hash`] for the NodePool template and the EC2NodeClass spec), and [`hash`]
//! folds it the same way:
//!
//! - the hasher is 64-bit FNV-1 (Go's `fnv.New64`, multiply then XOR), restarted for every
//!   value;
//! - a string hashes as its bytes; an integer as its little-endian bytes of its Go width (`int`
//!   and `uint` as 64 bits); a `bool` as the `int8` 0 or 1; a `time.Time` as the bytes of its
//!   `MarshalBinary` ([`time_binary`]);
//! - a struct starts from the hash of its type's name (without package); then, in declaration
//!   order, each field mixes in `ordered(hash(field name), hash(field value))` by XOR and the
//!   running hash is finished ([`finish`]) after each field, so the order of the fields
//!   matters;
//! - a map XORs `ordered(hash(key), hash(value))` over its entries, then finishes;
//! - a slice, with `SlicesAsSets` (upstream's option), XORs its elements' hashes and is not
//!   finished (so an empty slice hashes as 0, and two equal elements cancel out); a slice in a
//!   field tagged `hash:"set"` is finished after the XOR; without either, elements are chained
//!   with `ordered`.
//!
//! `ordered(a, b)` is the FNV-1 of the 16 little-endian bytes of `a` then `b`, and `finish(a)`
//! the FNV-1 of the 8 bytes of `a`.
//!
//! Upstream hashes with `IgnoreZeroValue` and `ZeroNil`: a struct field holding its type's zero
//! value (`""`, `0`, `false`, a nil pointer, slice or map, a struct whose fields are all zero)
//! is left out, while a pointer to a zero value, an empty non-nil slice or map, are not. The
//! tree builder decides which fields are zero: a field is added with [`Struct::field`] and a
//! `None` value leaves it out. Fields tagged `hash:"ignore"` are never added; a field tagged
//! `hash:"string"` is added as the string its `String()` method gives ([`quantity_string`] for a
//! `resource.Quantity`).

/// Width in bytes of a Go integer type, as the hash writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Width {
    /// `int8`, `uint8`.
    W8,
    /// `int16`, `uint16`.
    W16,
    /// `int32`, `uint32`.
    W32,
    /// `int64`, `uint64`, `int`, `uint`, `time.Duration`.
    W64,
}

impl Width {
    fn bytes(self) -> usize {
        match self {
            Width::W8 => 1,
            Width::W16 => 2,
            Width::W32 => 4,
            Width::W64 => 8,
        }
    }
}

/// A Go value as hashstructure sees it, pointers and interfaces already followed.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A `string`, or a named string type (`v1.TaintEffect`, `InstanceStorePolicy`).
    String(String),
    /// A signed integer of a Go width.
    Int(i64, Width),
    /// An unsigned integer of a Go width.
    Uint(u64, Width),
    /// A `bool`.
    Bool(bool),
    /// Bytes written as they are: a `time.Time` (see [`time_binary`]).
    Bytes(Vec<u8>),
    /// A slice, hashed according to [`Options::slices_as_sets`].
    Slice(Vec<Value>),
    /// A slice held by a struct field tagged `hash:"set"`.
    TaggedSet(Vec<Value>),
    /// A map, in any order.
    Map(Vec<(Value, Value)>),
    /// A struct.
    Struct(Struct),
}

impl Value {
    /// A string value.
    pub fn string(s: impl Into<String>) -> Self {
        Value::String(s.into())
    }

    /// An `int32` value.
    pub fn int32(v: i32) -> Self {
        Value::Int(i64::from(v), Width::W32)
    }

    /// An `int64` (or `int`, `time.Duration`) value.
    pub fn int64(v: i64) -> Self {
        Value::Int(v, Width::W64)
    }
}

/// A Go struct: its type's name and its fields not left out, in declaration order.
#[derive(Clone, Debug, PartialEq)]
pub struct Struct {
    name: &'static str,
    fields: Vec<(&'static str, Value)>,
}

impl Struct {
    /// A struct of the Go type `name` (without its package), with no fields yet.
    pub fn new(name: &'static str) -> Self {
        Struct { name, fields: Vec::new() }
    }

    /// With the field `name` (its Go name) holding `value`, or without it when `value` is `None`
    /// (the field holds its zero value). Fields must be added in declaration order.
    pub fn field(mut self, name: &'static str, value: Option<Value>) -> Self {
        if let Some(value) = value {
            self.fields.push((name, value));
        }
        self
    }

    /// This struct as the value of a non-pointer field: `None` when all its fields are zero
    /// (then the field is left out). A struct whose only non-zero fields are ignored ones is not
    /// zero in Go; no struct upstream hashes can be in that state here.
    pub fn non_zero(self) -> Option<Value> {
        (!self.fields.is_empty()).then_some(Value::Struct(self))
    }
}

impl From<Struct> for Value {
    fn from(s: Struct) -> Self {
        Value::Struct(s)
    }
}

/// The value of a Go `string` field: `None` (zero) when empty.
pub fn non_empty(s: &str) -> Option<Value> {
    (!s.is_empty()).then(|| Value::string(s))
}

/// The value of a Go `bool` field: `None` (zero) when false.
pub fn if_true(b: bool) -> Option<Value> {
    b.then_some(Value::Bool(true))
}

/// Options of the walk that change the hash of the tree itself (`IgnoreZeroValue` and `ZeroNil`
/// are the tree builder's business).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// Every slice is a set: its elements' hashes are XORed (and not finished).
    pub slices_as_sets: bool,
}

/// The options of upstream's NodePool and EC2NodeClass hashes (with `IgnoreZeroValue` and
/// `ZeroNil`, which the tree builders apply).
pub const UPSTREAM: Options = Options { slices_as_sets: true };

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// 64-bit FNV-1 of `bytes` (Go's `hash/fnv.New64`).
pub fn fnv1(bytes: &[u8]) -> u64 {
    bytes.iter().fold(FNV_OFFSET, |h, b| h.wrapping_mul(FNV_PRIME) ^ u64::from(*b))
}

/// `hashUpdateOrdered`: the hash of `a` then `b`.
fn ordered(a: u64, b: u64) -> u64 {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&a.to_le_bytes());
    bytes[8..].copy_from_slice(&b.to_le_bytes());
    fnv1(&bytes)
}

/// `hashFinishUnordered`: hardens a XOR of hashes so that it cannot cancel out later.
pub fn finish(a: u64) -> u64 {
    fnv1(&a.to_le_bytes())
}

/// hashstructure's `Hash(value, FormatV2, options)`.
pub fn hash(value: &Value, options: Options) -> u64 {
    match value {
        Value::String(s) => fnv1(s.as_bytes()),
        Value::Int(v, width) => fnv1(&v.to_le_bytes()[..width.bytes()]),
        Value::Uint(v, width) => fnv1(&v.to_le_bytes()[..width.bytes()]),
        Value::Bool(b) => fnv1(&[u8::from(*b)]),
        Value::Bytes(bytes) => fnv1(bytes),
        Value::Slice(items) if options.slices_as_sets => {
            items.iter().fold(0, |h, item| h ^ hash(item, options))
        }
        Value::Slice(items) => items.iter().fold(0, |h, item| ordered(h, hash(item, options))),
        Value::TaggedSet(items) => finish(items.iter().fold(0, |h, item| h ^ hash(item, options))),
        Value::Map(entries) => {
            finish(entries.iter().fold(0, |h, (k, v)| h ^ ordered(hash(k, options), hash(v, options))))
        }
        Value::Struct(s) => s.fields.iter().fold(fnv1(s.name.as_bytes()), |h, (name, v)| {
            finish(h ^ ordered(fnv1(name.as_bytes()), hash(v, options)))
        }),
    }
}

/// Seconds from January 1 of year 1 to the Unix epoch, the origin of Go's `time.Time` binary
/// form.
const UNIX_TO_INTERNAL: i64 = 62_135_596_800;

/// The bytes of Go's `time.Time.MarshalBinary` (version 1) for the instant `unix_seconds` +
/// `nanos` in a zone `offset_minutes` east of UTC, `-1` standing for the `UTC` location itself.
///
/// A `metav1.Time` read from JSON is in the `Local` location (`time.Parse(...).Local()`), which
/// in upstream's container (no zone configured) is UTC by offset but not the `UTC` location: its
/// offset is written as `0`.
pub fn time_binary(unix_seconds: i64, nanos: u32, offset_minutes: i16) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(15);
    bytes.push(1);
    bytes.extend_from_slice(&unix_seconds.wrapping_add(UNIX_TO_INTERNAL).to_be_bytes());
    bytes.extend_from_slice(&nanos.to_be_bytes());
    bytes.extend_from_slice(&offset_minutes.to_be_bytes());
    bytes
}

/// Go's `time.ParseDuration`: nanoseconds, or `None` where Go returns an error.
pub fn parse_go_duration(text: &str) -> Option<i64> {
    const MAX: u64 = 1 << 63;
    let mut s = text;
    let mut negative = false;
    if let Some(rest) = s.strip_prefix('-') {
        negative = true;
        s = rest;
    } else if let Some(rest) = s.strip_prefix('+') {
        s = rest;
    }
    if s == "0" {
        return Some(0);
    }
    if s.is_empty() {
        return None;
    }
    let mut total: u64 = 0;
    while !s.is_empty() {
        if !s.starts_with(|c: char| c == '.' || c.is_ascii_digit()) {
            return None;
        }
        let before = s.len();
        let (mut v, rest) = leading_int(s)?;
        s = rest;
        let has_int = s.len() != before;
        let (mut fraction, mut scale, mut has_fraction) = (0u64, 1f64, false);
        if let Some(rest) = s.strip_prefix('.') {
            let before = rest.len();
            let (f, sc, rest) = leading_fraction(rest);
            (fraction, scale, has_fraction) = (f, sc, rest.len() != before);
            s = rest;
        }
        if !has_int && !has_fraction {
            return None;
        }
        let unit_len = s.find(|c: char| c == '.' || c.is_ascii_digit()).unwrap_or(s.len());
        let unit: u64 = match &s[..unit_len] {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return None,
        };
        s = &s[unit_len..];
        if v > MAX / unit {
            return None;
        }
        v *= unit;
        if fraction > 0 {
            // As Go: float64 arithmetic, truncated.
            v = v.checked_add((fraction as f64 * (unit as f64 / scale)) as u64)?;
            if v > MAX {
                return None;
            }
        }
        total = total.checked_add(v)?;
        if total > MAX {
            return None;
        }
    }
    if negative {
        // -(1<<63) is i64::MIN, as in Go.
        return Some((total as i64).wrapping_neg());
    }
    i64::try_from(total).ok()
}

/// The leading decimal integer of `s` and the rest; `None` on overflow past 1<<63.
fn leading_int(s: &str) -> Option<(u64, &str)> {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let mut x: u64 = 0;
    for b in s[..end].bytes() {
        if x > (1u64 << 63) / 10 {
            return None;
        }
        x = x * 10 + u64::from(b - b'0');
        if x > 1 << 63 {
            return None;
        }
    }
    Some((x, &s[end..]))
}

/// The leading fraction digits of `s` as an integer and its scale (10 to the number of digits
/// kept; digits past int64 precision are read but dropped), and the rest.
fn leading_fraction(s: &str) -> (u64, f64, &str) {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (mut x, mut scale, mut overflow) = (0u64, 1f64, false);
    for b in s[..end].bytes() {
        if overflow {
            continue;
        }
        if x > ((1u64 << 63) - 1) / 10 {
            overflow = true;
            continue;
        }
        let y = x * 10 + u64::from(b - b'0');
        if y > 1 << 63 {
            overflow = true;
            continue;
        }
        x = y;
        scale *= 10.0;
    }
    (x, scale, &s[end..])
}

/// Format of a parsed quantity, from its suffix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    DecimalExponent,
    BinarySi,
    DecimalSi,
}

/// What `resource.Quantity.String()` gives for a quantity read from `text` (as JSON decoding
/// reads it): the text itself when the parser kept it (it was in canonical form), else the
/// canonical form (`1024Gi` is `1Ti`, `1000G` is `1T`, `1.5Gi` is `1536Mi`). A quantity this
/// cannot read (which the API server would not store), or one past 128-bit arithmetic, is
/// returned as it is.
pub fn quantity_string(text: &str) -> String {
    let text = text.trim();
    quantity_canonical(text).unwrap_or_else(|| text.to_string())
}

fn quantity_canonical(text: &str) -> Option<String> {
    if text == "0" {
        return Some(text.to_string());
    }
    let parsed = parse_quantity_text(text)?;
    let (base, exponent, format) = interpret_suffix(parsed.suffix)?;
    if parsed.fast_path_keeps_text(exponent, format) {
        return Some(text.to_string());
    }
    // The exact value: mantissa × 10^scale.
    let digits = format!("{}{}", parsed.num, parsed.denom);
    let mut mantissa: i128 = digits.parse().ok()?;
    let mut scale = -i32::try_from(parsed.denom.len()).ok()?;
    if base == 10 {
        scale += exponent;
    } else {
        mantissa = mantissa.checked_mul(1i128.checked_shl(u32::try_from(exponent).ok()?)?)?;
    }
    if !parsed.positive {
        mantissa = -mantissa;
    }
    // Amounts finer than a nano are rounded up (away from zero) to one.
    if scale < -9 {
        let divisor = 10i128.checked_pow(u32::try_from(-9 - scale).ok()?)?;
        let rounded = mantissa / divisor;
        mantissa = if mantissa % divisor == 0 { rounded } else { rounded + mantissa.signum() };
        scale = -9;
    }
    if mantissa == 0 {
        return Some("0".to_string());
    }
    let mut format = format;
    // A binary amount strictly between -1 and 1 is shown in decimal.
    if format == Format::BinarySi && is_below_one(mantissa, scale) {
        format = Format::DecimalSi;
    }
    if format == Format::BinarySi {
        match integer_value(mantissa, scale) {
            Some(v) if v.abs() >= 1024 => {
                let (mut amount, mut times) = (v.abs(), 0usize);
                while amount >= 1024 && amount % 1024 == 0 {
                    amount /= 1024;
                    times += 1;
                }
                let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"].get(times).copied().unwrap_or("");
                return Some(format!("{}{amount}{suffix}", if v < 0 { "-" } else { "" }));
            }
            _ => format = Format::DecimalSi,
        }
    }
    // Decimal: factors of ten into the exponent, then the exponent down to a multiple of 3.
    while mantissa.abs() >= 10 && mantissa % 10 == 0 {
        mantissa /= 10;
        scale += 1;
    }
    while scale.rem_euclid(3) != 0 {
        mantissa = mantissa.checked_mul(10)?;
        scale -= 1;
    }
    let suffix = match format {
        Format::DecimalExponent if scale == 0 => String::new(),
        Format::DecimalExponent => format!("e{scale}"),
        _ => match scale {
            -9 => "n",
            -6 => "u",
            -3 => "m",
            3 => "k",
            6 => "M",
            9 => "G",
            12 => "T",
            15 => "P",
            18 => "E",
            // Go has no suffix for other exponents and writes none.
            _ => "",
        }
        .to_string(),
    };
    Some(format!("{mantissa}{suffix}"))
}

/// Whether 0 < |mantissa × 10^scale| < 1.
fn is_below_one(mantissa: i128, scale: i32) -> bool {
    if scale >= 0 {
        return false;
    }
    match 10i128.checked_pow(scale.unsigned_abs()) {
        Some(p) => mantissa.abs() < p,
        None => true,
    }
}

/// mantissa × 10^scale when it is an integer that fits.
fn integer_value(mantissa: i128, scale: i32) -> Option<i128> {
    if scale >= 0 {
        return mantissa.checked_mul(10i128.checked_pow(scale.unsigned_abs())?);
    }
    let p = 10i128.checked_pow(scale.unsigned_abs())?;
    (mantissa % p == 0).then_some(mantissa / p)
}

/// A quantity's text split as apimachinery's `parseQuantityString` splits it.
struct QuantityText<'a> {
    positive: bool,
    /// Integer digits, leading zeros stripped (`"0"` when none are left).
    num: &'a str,
    /// Fraction digits.
    denom: &'a str,
    suffix: &'a str,
}

impl QuantityText<'_> {
    /// Whether `ParseQuantity` takes its fast path and keeps the text as the quantity's string.
    fn fast_path_keeps_text(&self, exponent: i32, format: Format) -> bool {
        let digits = self.num.len() + self.denom.len();
        let (precision, mut scale, mantissa): (i64, i64, i64) = match format {
            Format::DecimalExponent | Format::DecimalSi => (18 - digits as i64, i64::from(exponent), 1),
            Format::BinarySi if (0..63).contains(&exponent) && self.denom.is_empty() => {
                let precision = 15 - self.num.len() as i64 - (exponent as f32 * 3.0 / 10.0) as i64 - 1;
                (precision, 0, 1i64 << exponent)
            }
            Format::BinarySi => (-1, 0, 1),
        };
        if precision < 0 {
            return false;
        }
        scale -= self.denom.len() as i64;
        if scale < -9 {
            return false;
        }
        let shifted = format!("{}{}", self.num, self.denom);
        let Ok(value) = shifted.parse::<i64>() else { return false };
        if value.checked_mul(mantissa).is_none() {
            return false;
        }
        match format {
            Format::BinarySi => exponent % 10 == 0 && value & 0x07 != 0,
            _ => scale % 3 == 0 && !shifted.ends_with("000") && !shifted.starts_with('0'),
        }
    }
}

fn parse_quantity_text(text: &str) -> Option<QuantityText<'_>> {
    if text.is_empty() {
        return None;
    }
    let mut rest = text;
    let mut positive = true;
    if let Some(r) = rest.strip_prefix('-') {
        positive = false;
        rest = r;
    } else if let Some(r) = rest.strip_prefix('+') {
        rest = r;
    }
    let unzeroed = rest.trim_start_matches('0');
    if unzeroed.is_empty() {
        return Some(QuantityText { positive, num: "0", denom: "", suffix: "" });
    }
    rest = unzeroed;
    let end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
    let mut num = &rest[..end];
    rest = &rest[end..];
    if num.is_empty() {
        num = "0";
    }
    let mut denom = "";
    if let Some(r) = rest.strip_prefix('.') {
        let end = r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len());
        denom = &r[..end];
        rest = &r[end..];
    }
    // The suffix: letters, optionally followed by a signed exponent (`e3`, `E-2`).
    let letters = rest.find(|c: char| !c.is_ascii_alphabetic()).unwrap_or(rest.len());
    if letters < rest.len() {
        let tail = &rest[letters..];
        let is_exponent = letters == 1
            && rest.starts_with(['e', 'E'])
            && tail.trim_start_matches(['+', '-']).chars().all(|c| c.is_ascii_digit())
            && tail.trim_start_matches(['+', '-']).len() + 1 >= tail.len();
        if !is_exponent {
            return None;
        }
    }
    Some(QuantityText { positive, num, denom, suffix: rest })
}

/// Base, exponent and format of a quantity suffix.
fn interpret_suffix(suffix: &str) -> Option<(u32, i32, Format)> {
    let decimal = match suffix {
        "n" => Some(-9),
        "u" => Some(-6),
        "m" => Some(-3),
        "" => Some(0),
        "k" => Some(3),
        "M" => Some(6),
        "G" => Some(9),
        "T" => Some(12),
        "P" => Some(15),
        "E" => Some(18),
        _ => None,
    };
    if let Some(e) = decimal {
        return Some((10, e, Format::DecimalSi));
    }
    let binary = match suffix {
        "Ki" => Some(10),
        "Mi" => Some(20),
        "Gi" => Some(30),
        "Ti" => Some(40),
        "Pi" => Some(50),
        "Ei" => Some(60),
        _ => None,
    };
    if let Some(e) = binary {
        return Some((2, e, Format::BinarySi));
    }
    let exponent = suffix.strip_prefix(['e', 'E'])?;
    Some((10, exponent.parse().ok()?, Format::DecimalExponent))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(v: &Value) -> u64 {
        hash(v, UPSTREAM)
    }

    fn s(text: &str) -> Value {
        Value::string(text)
    }

    // Expected values computed by hashstructure v2.0.2 itself (FormatV2, SlicesAsSets,
    // IgnoreZeroValue, ZeroNil).
    #[test]
    fn scalars_hash_as_hashstructure_does() {
        assert_eq!(h(&s("")), 14695981039346656037);
        assert_eq!(h(&s("a")), 12638153115695167422);
        assert_eq!(h(&s("hello")), 8883723591023973575);
        assert_eq!(h(&Value::int64(1)), 16390143479181108970);
        assert_eq!(h(&Value::int32(1)), 4934814342159144266);
        assert_eq!(h(&Value::Int(-1, Width::W8)), 12638153115695167264);
        assert_eq!(h(&Value::Bool(true)), 12638153115695167454);
        assert_eq!(h(&Value::Bool(false)), 12638153115695167455);
    }

    #[test]
    fn collections_hash_as_hashstructure_does() {
        // As a set, two strings differing in their last byte XOR to the XOR of those bytes.
        assert_eq!(h(&Value::Slice(vec![s("a"), s("b")])), 3);
        assert_eq!(h(&Value::Slice(vec![s("b"), s("a")])), 3);
        assert_eq!(h(&Value::Slice(vec![])), 0);
        let ordered = Options { slices_as_sets: false };
        assert_eq!(hash(&Value::Slice(vec![s("a"), s("b")]), ordered), 2712570657419664240);
        assert_eq!(h(&Value::Map(vec![(s("a"), s("b"))])), 3629586248519120669);
        assert_eq!(h(&Value::Map(vec![])), 12161962213042174405);
        assert_eq!(h(&Value::Slice(vec![s("x"), Value::int64(3)])), 17848672281658619539);
    }

    #[test]
    fn structs_hash_as_hashstructure_does() {
        // metav1.Duration{90s} and a NillableDuration of 1h.
        let duration = Struct::new("Duration").field("Duration", Some(Value::int64(90_000_000_000)));
        assert_eq!(h(&duration.into()), 2583605024519583823);
        let nillable =
            Struct::new("NillableDuration").field("Duration", Some(Value::int64(3_600_000_000_000)));
        assert_eq!(h(&nillable.into()), 8354744272183861853);
        // A struct with every field zero hashes as its name.
        assert_eq!(h(&Struct::new("Outer").into()), 4355186753045308430);
        assert_eq!(h(&Struct::new("Outer").into()), fnv1(b"Outer"));
        // type Outer struct { Name string; Count int64; Flag bool; Ptr *string; List []string;
        //   Set []string `hash:"set"`; M map[string]string; In Inner; Skip string `hash:"ignore"` }
        // type Inner struct { A string; B int32 }
        let inner = Struct::new("Inner").field("A", non_empty("a")).field("B", Some(Value::int32(2)));
        let outer = Struct::new("Outer")
            .field("Name", non_empty("n"))
            .field("Count", Some(Value::int64(7)))
            .field("Flag", if_true(true))
            .field("Ptr", Some(s("")))
            .field("List", Some(Value::Slice(vec![s("x"), s("y")])))
            .field("Set", Some(Value::TaggedSet(vec![s("p"), s("q")])))
            .field("M", Some(Value::Map(vec![(s("k"), s("v"))])))
            .field("In", inner.non_zero());
        assert_eq!(h(&outer.into()), 17044055870381238509);
    }

    #[test]
    fn times_hash_as_their_binary_form() {
        // 2024-05-01T12:30:00Z: in the UTC location, and (as read from JSON) in a Local one
        // that is UTC, 5ns later.
        let unix = 1_714_566_600;
        let time = |nanos: u32, offset: i16| {
            let bytes = Value::Bytes(time_binary(unix, nanos, offset));
            Value::Struct(Struct::new("Time").field("Time", Some(bytes)))
        };
        assert_eq!(h(&time(0, -1)), 16572265246717947345);
        assert_eq!(h(&time(5, 0)), 3525335796384492462);
    }

    #[test]
    fn durations_parse_as_go_does() {
        for (text, nanos) in [
            ("1m30s", 90_000_000_000),
            ("1.5m", 90_000_000_000),
            ("1h30m", 5_400_000_000_000),
            ("500ms", 500_000_000),
            ("1.000000001s", 1_000_000_001),
            ("-1.5h", -5_400_000_000_000),
            ("0", 0),
            ("+5s", 5_000_000_000),
            (".5s", 500_000_000),
            ("1.s", 1_000_000_000),
            ("720h", 2_592_000_000_000_000),
            ("2562047h", 9_223_369_200_000_000_000),
            ("1us", 1_000),
            ("1\u{b5}s", 1_000),
            ("3ns", 3),
            ("0.1ns", 0),
            ("1.0000000005s", 1_000_000_000),
        ] {
            assert_eq!(parse_go_duration(text), Some(nanos), "{text}");
        }
        for bad in ["", "1", "s", ".s", "1x", "2562048h", "-", "Never"] {
            assert_eq!(parse_go_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn quantities_read_back_as_apimachinery_writes_them() {
        for (text, string) in [
            ("1024Gi", "1Ti"),
            ("1000G", "1T"),
            ("2T", "2T"),
            ("20Gi", "20Gi"),
            ("4Gi", "4Gi"),
            ("8Gi", "8Gi"),
            ("100Gi", "100Gi"),
            ("100Mi", "100Mi"),
            ("1.5Gi", "1536Mi"),
            ("0.5Ti", "512Gi"),
            ("100m", "100m"),
            ("1500m", "1500m"),
            ("0.1", "100m"),
            ("1e3", "1e3"),
            ("1E3", "1E3"),
            ("12e6", "12e6"),
            ("1000", "1k"),
            ("1k", "1k"),
            ("1024", "1024"),
            ("1023Ki", "1023Ki"),
            ("1025", "1025"),
            ("2048", "2048"),
            ("1Ki", "1Ki"),
            ("512Ki", "512Ki"),
            ("0.5Ki", "512"),
            ("1.1Gi", "1181116006400m"),
            ("-5Gi", "-5Gi"),
            ("0", "0"),
            ("0Gi", "0"),
            ("1500G", "1500G"),
            ("1.5G", "1500M"),
            ("0.000000001", "1n"),
            ("3000000000", "3G"),
        ] {
            assert_eq!(quantity_string(text), string, "{text}");
        }
    }
}
