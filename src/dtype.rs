//! The element types the tool measures and budgets in: float32, float16 and bfloat16.

use serde::{Deserialize, Serialize};

/// An element type of weights, activations and gradients.
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
}

fn unknown_dtype(s: &str) -> String {
    format!("unknown dtype `{s}`; expected float32, float16 or bfloat16")
}

impl Dtype {
    /// Every dtype, in the order the help text lists them.
    pub const ALL: &'static [Dtype] = <Dtype as strum::VariantArray>::VARIANTS;

    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            Dtype::Float32 => 4,
            Dtype::Float16 | Dtype::Bfloat16 => 2,
        }
    }

    /// The name in files and on the command line (`bfloat16`).
    pub fn name(self) -> &'static str {
        self.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_unknown_ones_say_what_is_expected() {
        for d in Dtype::ALL {
            assert_eq!(d.name().parse::<Dtype>().unwrap(), *d);
            assert_eq!(d.to_string(), d.name());
        }
        assert_eq!(
            "fp8".parse::<Dtype>().unwrap_err(),
            "unknown dtype `fp8`; expected float32, float16 or bfloat16"
        );
    }
}
