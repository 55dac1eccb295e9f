//! Static parameters: the plain Rust values a launch function takes besides its arrays (block shapes,
//! epsilons, flags — Pallas's `functools.partial` arguments), read from and written to JSON at the
//! library boundary. Each type says what it is called in messages, so a wrong value from Python is an
//! error naming the parameter and the type it expects.

use serde_json::Value;

/// A value a kernel export takes as a static parameter: ints, floats, bools, strings, and tuples,
/// arrays or `Vec`s of them (also what a host function takes and returns, `host`).
pub trait StaticParam: Sized {
    /// The Rust spelling of the type, shown in messages and in the library description.
    fn type_name() -> String;
    /// Read a value; `Err` says what was wrong (the caller adds the parameter name).
    fn from_json(v: &Value) -> Result<Self, String>;
    fn to_json(&self) -> Value;
}

/// A value as shown in a message: its JSON text, cut to 57 characters (not bytes: a value from Python
/// may hold any text, and a cut inside a character would panic) and an ellipsis past 60.
fn describe(v: &Value) -> String {
    let text = v.to_string();
    if text.chars().count() > 60 {
        format!("{}…", text.chars().take(57).collect::<String>())
    } else {
        text
    }
}

macro_rules! int_param {
    ($($t:ty),*) => {$(
        impl StaticParam for $t {
            fn type_name() -> String {
                stringify!($t).to_string()
            }
            fn from_json(v: &Value) -> Result<Self, String> {
                let n = v.as_i64().map(i128::from).or_else(|| v.as_u64().map(i128::from));
                match n {
                    Some(n) => <$t>::try_from(n).map_err(|_| {
                        format!("{n} is out of range for {}", stringify!($t))
                    }),
                    None => Err(format!("expected an integer ({}), got {}", stringify!($t), describe(v))),
                }
            }
            fn to_json(&self) -> Value {
                Value::from(*self)
            }
        }
    )*};
}
int_param!(usize, u32, u64, i32, i64);

macro_rules! float_param {
    ($($t:ty),*) => {$(
        impl StaticParam for $t {
            fn type_name() -> String {
                stringify!($t).to_string()
            }
            fn from_json(v: &Value) -> Result<Self, String> {
                // Integers are accepted where a float is expected (`eps=1` in Python); NaN and the
                // infinities, which JSON has no numbers for, come as "nan", "inf", "-inf".
                let x = match v {
                    Value::String(s) if s == "nan" => return Ok(<$t>::NAN),
                    Value::String(s) if s == "inf" => return Ok(<$t>::INFINITY),
                    Value::String(s) if s == "-inf" => return Ok(<$t>::NEG_INFINITY),
                    Value::Number(n) => n.as_f64(),
                    _ => None,
                }
                .ok_or_else(|| format!("expected a number ({}), got {}", stringify!($t), describe(v)))?;
                let y = x as $t;
                if y.is_infinite() {
                    return Err(format!(
                        "expected a number ({}), got {x}, which is outside {}'s range (±{:e}); pass \"inf\" or \"-inf\" for an infinity",
                        stringify!($t),
                        stringify!($t),
                        <$t>::MAX
                    ));
                }
                Ok(y)
            }
            fn to_json(&self) -> Value {
                if self.is_nan() {
                    return Value::String("nan".into());
                }
                if self.is_infinite() {
                    return Value::String(if *self > 0.0 { "inf" } else { "-inf" }.into());
                }
                // The shortest decimal that reads back as this value (`1e-6f32` is 1e-06 in
                // Python, not 9.999999974752427e-07).
                let shortest: f64 = self.to_string().parse().unwrap_or(*self as f64);
                serde_json::Number::from_f64(shortest).map_or(Value::Null, Value::Number)
            }
        }
    )*};
}
float_param!(f32, f64);

impl StaticParam for bool {
    fn type_name() -> String {
        "bool".into()
    }
    fn from_json(v: &Value) -> Result<Self, String> {
        v.as_bool()
            .ok_or_else(|| format!("expected a bool, got {}", describe(v)))
    }
    fn to_json(&self) -> Value {
        Value::Bool(*self)
    }
}

impl StaticParam for String {
    fn type_name() -> String {
        "String".into()
    }
    fn from_json(v: &Value) -> Result<Self, String> {
        v.as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("expected a string, got {}", describe(v)))
    }
    fn to_json(&self) -> Value {
        Value::String(self.clone())
    }
}

/// An optional value: Python's `None` (JSON `null`) or a value of `T` (tpu-inference's
/// `sliding_window: int | None = None` and the like).
impl<T: StaticParam> StaticParam for Option<T> {
    fn type_name() -> String {
        format!("Option<{}>", T::type_name())
    }
    fn from_json(v: &Value) -> Result<Self, String> {
        match v {
            Value::Null => Ok(None),
            v => T::from_json(v).map(Some),
        }
    }
    fn to_json(&self) -> Value {
        self.as_ref().map_or(Value::Null, T::to_json)
    }
}

fn elements(v: &Value, n: usize, what: &str) -> Result<Vec<Value>, String> {
    match v.as_array() {
        Some(items) if items.len() == n => Ok(items.clone()),
        Some(items) => Err(format!(
            "expected {what} of {n} elements, got {} elements: {}",
            items.len(),
            describe(v)
        )),
        None => Err(format!(
            "expected {what} of {n} elements, got {}",
            describe(v)
        )),
    }
}

impl<T: StaticParam, const N: usize> StaticParam for [T; N] {
    fn type_name() -> String {
        format!("[{}; {N}]", T::type_name())
    }
    fn from_json(v: &Value) -> Result<Self, String> {
        let items = elements(v, N, "a sequence")?;
        let parsed: Vec<T> = items
            .iter()
            .enumerate()
            .map(|(i, x)| T::from_json(x).map_err(|e| format!("element {i}: {e}")))
            .collect::<Result<_, _>>()?;
        parsed
            .try_into()
            .map_err(|_| "internal: array length".to_string())
    }
    fn to_json(&self) -> Value {
        Value::Array(self.iter().map(T::to_json).collect())
    }
}

/// A sequence of any length (a host function's group sizes; JSON's arrays, Python's lists and tuples).
impl<T: StaticParam> StaticParam for Vec<T> {
    fn type_name() -> String {
        format!("Vec<{}>", T::type_name())
    }
    fn from_json(v: &Value) -> Result<Self, String> {
        let items = v
            .as_array()
            .ok_or_else(|| format!("expected a sequence, got {}", describe(v)))?;
        items
            .iter()
            .enumerate()
            .map(|(i, x)| T::from_json(x).map_err(|e| format!("element {i}: {e}")))
            .collect()
    }
    fn to_json(&self) -> Value {
        Value::Array(self.iter().map(T::to_json).collect())
    }
}

macro_rules! tuple_param {
    ($n:literal; $($t:ident $i:tt),*) => {
        impl<$($t: StaticParam),*> StaticParam for ($($t,)*) {
            fn type_name() -> String {
                let names: Vec<String> = vec![$($t::type_name()),*];
                if names.len() == 1 {
                    format!("({},)", names[0])
                } else {
                    format!("({})", names.join(", "))
                }
            }
            fn from_json(v: &Value) -> Result<Self, String> {
                let items = elements(v, $n, "a tuple")?;
                Ok(($(
                    $t::from_json(&items[$i]).map_err(|e| format!("element {}: {e}", $i))?,
                )*))
            }
            fn to_json(&self) -> Value {
                Value::Array(vec![$(self.$i.to_json()),*])
            }
        }
    };
}
tuple_param!(1; A 0);
tuple_param!(2; A 0, B 1);
tuple_param!(3; A 0, B 1, C 2);
tuple_param!(4; A 0, B 1, C 2, D 3);
tuple_param!(5; A 0, B 1, C 2, D 3, E 4);
tuple_param!(6; A 0, B 1, C 2, D 3, E 4, F 5);

/// One static parameter of an exported kernel: its name, type and default.
#[derive(Clone, Debug)]
pub struct ParamSpec {
    pub name: &'static str,
    pub type_name: String,
    /// `None`: the caller must pass it.
    pub default: Option<Value>,
    /// Parse a value as the parameter's type and write it back: the canonical form of a valid value
    /// (so `eps=1` and `eps=1.0` build one kernel), or what is wrong with an invalid one.
    pub canonical: fn(&Value) -> Result<Value, String>,
}

impl ParamSpec {
    pub fn new<T: StaticParam>(name: &'static str, default: Option<T>) -> Self {
        ParamSpec {
            name,
            type_name: T::type_name(),
            default: default.as_ref().map(T::to_json),
            canonical: |v| T::from_json(v).map(|t| t.to_json()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trips_and_messages() {
        let b = <(usize, usize, usize)>::from_json(&json!([128, 256, 512])).unwrap();
        assert_eq!(b, (128, 256, 512));
        assert_eq!(b.to_json(), json!([128, 256, 512]));
        assert_eq!(<(usize, usize)>::type_name(), "(usize, usize)");
        let e = <(usize, usize, usize)>::from_json(&json!([128, 128])).unwrap_err();
        assert!(e.contains("3 elements, got 2"), "{e}");
        let e = usize::from_json(&json!(-1)).unwrap_err();
        assert!(e.contains("out of range"), "{e}");
        let e = usize::from_json(&json!(1.5)).unwrap_err();
        assert!(e.contains("expected an integer"), "{e}");
        assert_eq!(f32::from_json(&json!(1)).unwrap(), 1.0);
        assert_eq!(1e-6f32.to_json(), json!(1e-6));
        assert_eq!(f32::from_json(&1e-6f32.to_json()).unwrap(), 1e-6f32);
        assert!(f32::from_json(&json!(true)).is_err());
        assert_eq!(<[i32; 2]>::from_json(&json!([1, -2])).unwrap(), [1, -2]);
        let e = <[i32; 2]>::from_json(&json!([1, "a"])).unwrap_err();
        assert!(e.starts_with("element 1"), "{e}");
        assert_eq!(
            Vec::<i32>::from_json(&json!([])).unwrap(),
            Vec::<i32>::new()
        );
        assert_eq!(
            Vec::<i32>::from_json(&json!([3, 0, -1])).unwrap(),
            [3, 0, -1]
        );
        assert_eq!(vec![1u32, 2].to_json(), json!([1, 2]));
        assert_eq!(Vec::<i32>::type_name(), "Vec<i32>");
        let e = Vec::<i32>::from_json(&json!([1, 2.5])).unwrap_err();
        assert!(e.starts_with("element 1: expected an integer"), "{e}");
        let e = Vec::<i32>::from_json(&json!(3)).unwrap_err();
        assert!(e.contains("expected a sequence"), "{e}");
    }

    /// Found by the Python suite's generated bad calls: a long value whose 57th byte falls inside a
    /// character panicked while its message was written ("end byte index 57 is not a char boundary").
    #[test]
    fn long_values_in_messages_are_cut_between_characters() {
        let v = json!([
            true,
            -100000,
            -1.1805916207174062e21,
            "000\u{1f}\r\u{7}\u{800}"
        ]);
        // 59 characters, 61 bytes: shown whole.
        let e = usize::from_json(&v).unwrap_err();
        assert!(
            e.contains("expected an integer") && e.contains('\u{800}'),
            "{e}"
        );
        // Longer ones are cut after 57 characters, whatever their bytes.
        for n in 25..70 {
            let e = usize::from_json(&json!(format!("x{}", "é".repeat(n)))).unwrap_err();
            let shown = e.rsplit("got ").next().unwrap();
            assert_eq!(
                shown.chars().count(),
                if n + 3 > 60 { 58 } else { n + 3 },
                "{e}"
            );
        }
    }
}
