//! The element types of tensors, the one type the tool measures, budgets and emulates in: the
//! floating types a user chooses (float32, float16, bfloat16) and the others the stack's
//! tensors hold (int64 positions and ids, int32, bool masks, uint8 bytes).

use serde::{Deserialize, Serialize};

/// An element type.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    strum::Display,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::VariantArray,
)]
#[serde(rename_all = "lowercase")]
#[strum(
    serialize_all = "lowercase",
    parse_err_fn = unknown_dtype,
    parse_err_ty = String
)]
pub enum Dtype {
    Float32,
    Float16,
    Bfloat16,
    Int64,
    Int32,
    Bool,
    Uint8,
}

fn unknown_dtype(s: &str) -> String {
    format!("unknown dtype `{s}`; expected float32, float16 or bfloat16")
}

impl Dtype {
    /// The floating types weights, activations and gradients are chosen in, in the order the help
    /// text lists them.
    pub const FLOATS: [Dtype; 3] = [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16];

    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            Dtype::Float32 | Dtype::Int32 => 4,
            Dtype::Float16 | Dtype::Bfloat16 => 2,
            Dtype::Int64 => 8,
            Dtype::Bool | Dtype::Uint8 => 1,
        }
    }

    /// The name in files and on the command line (`bfloat16`).
    pub fn name(self) -> &'static str {
        self.into()
    }

    pub fn is_float(self) -> bool {
        Dtype::FLOATS.contains(&self)
    }

    /// A floating type a user may choose, from its name (`float32`, `float16`, `bfloat16`).
    pub fn float(s: &str) -> Result<Dtype, String> {
        s.parse::<Dtype>()
            .ok()
            .filter(|d| d.is_float())
            .ok_or_else(|| unknown_dtype(s))
    }

    /// The type of a binary operation's result (PyTorch's promotion between floating types; a
    /// float beats an integer).
    pub fn promote(self, other: Dtype) -> Dtype {
        use Dtype::*;
        match (self, other) {
            (a, b) if a == b => a,
            (Float32, _) | (_, Float32) => Float32,
            (Float16, Bfloat16) | (Bfloat16, Float16) => Float32,
            (a, _) if a.is_float() => a,
            (_, b) if b.is_float() => b,
            (Int64, _) | (_, Int64) => Int64,
            (a, _) => a,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_unknown_ones_say_what_is_expected() {
        for d in Dtype::FLOATS {
            assert_eq!(Dtype::float(d.name()).unwrap(), d);
            assert_eq!(d.to_string(), d.name());
        }
        for wrong in ["fp8", "int64"] {
            assert_eq!(
                Dtype::float(wrong).unwrap_err(),
                format!("unknown dtype `{wrong}`; expected float32, float16 or bfloat16")
            );
        }
    }
}
