//! Package costing (seed section 4): total = lot price × lots, exact in cents; the cost per
//! accepted result only when the user gives the number of distinct accepted results.

use crate::catalog::{Catalog, CatalogError, CatalogSource};
use crate::markup::{rows_text, Rows};
use crate::money::Cents;
use crate::units::{ratio_is_exact, ratio_rounded};
use rust_decimal::Decimal;
use serde::Serialize;
use std::fmt;

/// Decimals of USD kept in a unit cost (hundredths of a micro-dollar are not money).
pub const UNIT_COST_DECIMALS: u32 = 6;
pub const UNIT_COST_RULE: &str =
    "unit cost = total price of the whole package / accepted results, \
computed exactly on integer cents and rounded half away from zero to 6 decimals of USD";

#[derive(Debug, thiserror::Error)]
pub enum QuoteError {
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error("the number of lots must be a positive integer, got 0")]
    ZeroLots,
    #[error("the number of accepted results must be a positive integer, got 0")]
    ZeroAcceptedResults,
    #[error("the total price overflows: {lots} lots × {lot}")]
    Overflow { lots: u64, lot: Cents },
}

impl crate::status::Classify for QuoteError {
    fn status(&self) -> crate::status::Status {
        match self {
            QuoteError::Catalog(e) => crate::status::Classify::status(e),
            _ => crate::status::Status::Usage,
        }
    }
}

/// Cost per accepted result.
#[derive(Debug, Clone, Serialize)]
pub struct UnitCost {
    /// USD per accepted result, as a decimal string.
    pub usd: Decimal,
    /// Whether `usd` is the exact quotient (false: it was rounded).
    pub exact: bool,
    /// The exact quotient as a fraction of cents.
    pub numerator_cents: u64,
    pub denominator: u64,
    pub rounding: &'static str,
}

/// A priced package; money fields are integer cents in JSON.
#[derive(Debug, Clone, Serialize)]
pub struct Quote {
    pub catalog: CatalogSource,
    pub model: String,
    pub display_name: String,
    pub duration_days: u32,
    pub lots: u64,
    pub gpus_per_lot: u32,
    pub total_gpus: u64,
    pub memory_per_gpu_gib: Decimal,
    pub lot_price_usd_cents: Cents,
    pub total_usd_cents: Cents,
    pub snapshot_date: String,
    /// Distinct accepted results given by the user; `null` when not given.
    pub accepted_results: Option<u64>,
    /// `null` unless `accepted_results` was given.
    pub unit_cost: Option<UnitCost>,
}

/// What is priced: `lots` lots of the catalog's model `gpu` for `days` days, and the distinct
/// results accepted from the run, when known (the unit cost needs them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Order<'a> {
    pub gpu: &'a str,
    pub days: u32,
    pub lots: u64,
    pub accepted_results: Option<u64>,
}

impl Catalog {
    /// Prices `order` from this catalog (see [`quote`]).
    pub fn quote(&self, order: &Order) -> Result<Quote, QuoteError> {
        quote(
            self,
            order.gpu,
            order.days,
            order.lots,
            order.accepted_results,
        )
    }
}

/// Prices `lots` lots of `model` over `days` from `catalog`.
fn quote(
    catalog: &Catalog,
    model: &str,
    days: u32,
    lots: u64,
    accepted_results: Option<u64>,
) -> Result<Quote, QuoteError> {
    let offer = catalog.offer(model, days)?;
    if lots == 0 {
        return Err(QuoteError::ZeroLots);
    }
    let overflow = || QuoteError::Overflow {
        lots,
        lot: offer.lot_price_usd_cents,
    };
    let total = offer
        .lot_price_usd_cents
        .checked_mul(lots)
        .ok_or_else(overflow)?;
    let total_gpus = lots
        .checked_mul(offer.gpus_per_lot.into())
        .ok_or_else(overflow)?;
    let unit_cost = match accepted_results {
        None => None,
        Some(0) => return Err(QuoteError::ZeroAcceptedResults),
        Some(n) => Some(unit_cost(total, n)),
    };
    Ok(Quote {
        catalog: catalog.source.clone(),
        model: offer.model.clone(),
        display_name: offer.display_name.clone(),
        duration_days: days,
        lots,
        gpus_per_lot: offer.gpus_per_lot,
        total_gpus,
        memory_per_gpu_gib: offer.memory_per_gpu_gib,
        lot_price_usd_cents: offer.lot_price_usd_cents,
        total_usd_cents: total,
        snapshot_date: offer.snapshot_date.clone(),
        accepted_results,
        unit_cost,
    })
}

/// total / n in USD, exact on integers, rounded as `UNIT_COST_RULE` says.
pub fn unit_cost(total: Cents, accepted_results: u64) -> UnitCost {
    let denominator = u128::from(accepted_results) * 100;
    UnitCost {
        usd: ratio_rounded(total.0.into(), denominator, UNIT_COST_DECIMALS),
        exact: ratio_is_exact(total.0.into(), denominator, UNIT_COST_DECIMALS),
        numerator_cents: total.0,
        denominator: accepted_results,
        rounding: UNIT_COST_RULE,
    }
}

/// What a quote from illustrative prices says, in every form.
pub const ILLUSTRATIVE_BANNER: &str =
    "ILLUSTRATIVE: these prices are stand-ins, not a real offer; \
load a real catalog with its file (--catalog on the command line).";
/// What a quote from published prices says, in every form.
pub const PUBLISHED_BANNER: &str = "Check the live offer before any purchase.";

impl Quote {
    /// The quote as label/value rows: its text and HTML forms are both drawn from them.
    pub fn rows(&self) -> Rows {
        let mut rows: Rows = vec![
            ("catalog", self.catalog.to_string()),
            (
                "model",
                format!(
                    "{} ({}), snapshot {}",
                    self.model, self.display_name, self.snapshot_date
                ),
            ),
            (
                "duration",
                format!("{} days (no proration)", self.duration_days),
            ),
            (
                "lots",
                format!(
                    "{} × {} GPU(s) per lot = {} GPU(s), {} GiB each",
                    self.lots, self.gpus_per_lot, self.total_gpus, self.memory_per_gpu_gib
                ),
            ),
            (
                "lot price",
                format!(
                    "{} (includes the lot's {} GPU(s))",
                    self.lot_price_usd_cents, self.gpus_per_lot
                ),
            ),
            (
                "total",
                format!(
                    "{} = {} × {}",
                    self.total_usd_cents, self.lots, self.lot_price_usd_cents
                ),
            ),
        ];
        match &self.unit_cost {
            None => rows.push((
                "unit cost",
                "not computed (give the number of distinct accepted results)".into(),
            )),
            Some(u) => {
                rows.push((
                    "unit cost",
                    format!(
                        "USD {} per accepted result ({} / {} results){}",
                        u.usd,
                        self.total_usd_cents,
                        u.denominator,
                        if u.exact { ", exact" } else { ", rounded" }
                    ),
                ));
                rows.push(("rounding", u.rounding.to_string()));
            }
        }
        rows
    }
}

impl CatalogSource {
    /// The banner every quote and plan from this catalog ends with.
    pub fn banner(&self) -> &'static str {
        if self.illustrative {
            ILLUSTRATIVE_BANNER
        } else {
            PUBLISHED_BANNER
        }
    }
}

impl fmt::Display for Quote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        rows_text(f, "Package quote", &self.rows(), 17)?;
        write!(f, "{}", self.catalog.banner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::BUILTIN_CSV;

    fn catalog() -> Catalog {
        Catalog::parse(BUILTIN_CSV, "builtin").unwrap()
    }

    #[test]
    fn two_b200_lots_cost_twice_the_lot_and_give_four_gpus() {
        let c = catalog();
        let lot = c.offer("b200", 7).unwrap().lot_price_usd_cents;
        let q = quote(&c, "b200", 7, 2, None).unwrap();
        assert_eq!(q.total_usd_cents, Cents(lot.0 * 2));
        assert_eq!(q.total_gpus, 4);
        assert!(q.unit_cost.is_none());
        assert!(q.to_string().contains("not computed"));
    }

    #[test]
    fn unit_cost_is_exact_or_says_it_was_rounded() {
        let u = unit_cost(Cents(312_800), 1000);
        assert_eq!(u.usd.to_string(), "3.128000");
        assert!(u.exact);
        let u = unit_cost(Cents(100), 3);
        assert_eq!(u.usd.to_string(), "0.333333");
        assert!(!u.exact);
        let u = unit_cost(Cents(u64::MAX), 1);
        assert_eq!(u.usd.to_string(), "184467440737095516.150000");
    }

    #[test]
    fn zero_and_overflow_are_refused() {
        let c = catalog();
        assert!(matches!(
            quote(&c, "b200", 7, 0, None),
            Err(QuoteError::ZeroLots)
        ));
        assert!(matches!(
            quote(&c, "b200", 7, 1, Some(0)),
            Err(QuoteError::ZeroAcceptedResults)
        ));
        assert!(matches!(
            quote(&c, "b200", 7, u64::MAX, None),
            Err(QuoteError::Overflow { .. })
        ));
    }
}
