//! What a prefill and a decode engine must agree on for one to hand a request's KV
//! cache to the other, as the engines themselves require it.

use std::fmt;
use std::sync::Arc;

/// What an engine says about the KV hand-over between prefill and decode engines.
///
/// Each field is what the engine reports; one it does not report (vLLM reports none,
/// as it serves no `/server_info`) is `None` and never keeps a pair apart.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PdProfile {
    /// The transfer backend (SGLang's `disaggregation_transfer_backend`: `mooncake`,
    /// `nixl`, ...): each side speaks only its own.
    pub transfer_backend: Option<Arc<str>>,
    /// Tokens per KV page: the decode engine refuses a prefill engine of another.
    pub page_size: Option<u32>,
    /// The KV cache's data type (`kv_cache_dtype`): the decode engine refuses a
    /// prefill engine of another.
    pub kv_cache_dtype: Option<Arc<str>>,
    /// Tensor-parallel ranks an attention layer spans: the decode engine maps its
    /// ranks onto the prefill engine's when one size is a multiple of the other.
    pub attention_tp_size: Option<u32>,
    /// Pipeline stages: a decode engine has the prefill engine's, or one.
    pub pp_size: Option<u32>,
}

/// The first thing a prefill and a decode engine disagree on, with what each says.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PdMismatch {
    /// Different transfer backends.
    TransferBackend {
        /// The prefill engine's.
        prefill: Arc<str>,
        /// The decode engine's.
        decode: Arc<str>,
    },
    /// Different KV cache data types.
    KvCacheDtype {
        /// The prefill engine's.
        prefill: Arc<str>,
        /// The decode engine's.
        decode: Arc<str>,
    },
    /// Different page sizes.
    PageSize {
        /// The prefill engine's.
        prefill: u32,
        /// The decode engine's.
        decode: u32,
    },
    /// Attention tensor-parallel sizes neither of which is a multiple of the other.
    AttentionTpSize {
        /// The prefill engine's.
        prefill: u32,
        /// The decode engine's.
        decode: u32,
    },
    /// A decode engine of several pipeline stages, other than the prefill engine's.
    PpSize {
        /// The prefill engine's.
        prefill: u32,
        /// The decode engine's.
        decode: u32,
    },
}

impl PdMismatch {
    /// The name of the field the engines disagree on, as `/server_info` names it
    /// (`attention_tp_size` is derived from `tp_size`, `dp_size`,
    /// `enable_dp_attention` and `attn_cp_size`).
    pub fn field(&self) -> &'static str {
        match self {
            PdMismatch::TransferBackend { .. } => "disaggregation_transfer_backend",
            PdMismatch::KvCacheDtype { .. } => "kv_cache_dtype",
            PdMismatch::PageSize { .. } => "page_size",
            PdMismatch::AttentionTpSize { .. } => "attention_tp_size",
            PdMismatch::PpSize { .. } => "pp_size",
        }
    }

    /// What the prefill engine and the decode engine say, in that order.
    pub fn values(&self) -> (String, String) {
        match self {
            PdMismatch::TransferBackend { prefill, decode }
            | PdMismatch::KvCacheDtype { prefill, decode } => {
                (prefill.to_string(), decode.to_string())
            }
            PdMismatch::PageSize { prefill, decode }
            | PdMismatch::AttentionTpSize { prefill, decode }
            | PdMismatch::PpSize { prefill, decode } => (prefill.to_string(), decode.to_string()),
        }
    }

    /// What is wrong with the two values.
    fn rule(&self) -> &'static str {
        match self {
            PdMismatch::TransferBackend { .. }
            | PdMismatch::KvCacheDtype { .. }
            | PdMismatch::PageSize { .. } => " differ",
            PdMismatch::AttentionTpSize { .. } => " are not multiples of one another",
            PdMismatch::PpSize { .. } => {
                ": a decode engine has the prefill engine's pipeline stages or one"
            }
        }
    }
}

impl fmt::Display for PdMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (prefill, decode) = self.values();
        write!(
            f,
            "{} {prefill} (prefill) and {decode} (decode){}",
            self.field(),
            self.rule()
        )
    }
}

impl PdProfile {
    /// The first thing that keeps a prefill engine of this profile from handing its
    /// KV cache to a decode engine of profile `decode`; `None` when every field both
    /// report allows the pair.
    pub fn mismatch(&self, decode: &PdProfile) -> Option<PdMismatch> {
        let texts = |p: &Option<Arc<str>>, d: &Option<Arc<str>>| match (p, d) {
            (Some(p), Some(d)) if p != d => Some((Arc::clone(p), Arc::clone(d))),
            _ => None,
        };
        let sizes = |p: Option<u32>, d: Option<u32>, fits: fn(u32, u32) -> bool| match (p, d) {
            (Some(p), Some(d)) if !fits(p, d) => Some((p, d)),
            _ => None,
        };
        if let Some((prefill, decode)) = texts(&self.transfer_backend, &decode.transfer_backend) {
            return Some(PdMismatch::TransferBackend { prefill, decode });
        }
        if let Some((prefill, decode)) = texts(&self.kv_cache_dtype, &decode.kv_cache_dtype) {
            return Some(PdMismatch::KvCacheDtype { prefill, decode });
        }
        if let Some((prefill, decode)) = sizes(self.page_size, decode.page_size, |p, d| p == d) {
            return Some(PdMismatch::PageSize { prefill, decode });
        }
        if let Some((prefill, decode)) =
            sizes(self.attention_tp_size, decode.attention_tp_size, |p, d| {
                p.max(d).checked_rem(p.min(d)) == Some(0)
            })
        {
            return Some(PdMismatch::AttentionTpSize { prefill, decode });
        }
        sizes(self.pp_size, decode.pp_size, |p, d| d == p || d == 1)
            .map(|(prefill, decode)| PdMismatch::PpSize { prefill, decode })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(page: u32, tp: u32, pp: u32) -> PdProfile {
        PdProfile {
            page_size: Some(page),
            attention_tp_size: Some(tp),
            pp_size: Some(pp),
            ..PdProfile::default()
        }
    }

    #[test]
    fn engines_that_say_the_same_pair() {
        let profile = PdProfile {
            transfer_backend: Some("mooncake".into()),
            kv_cache_dtype: Some("auto".into()),
            ..sizes(16, 2, 1)
        };
        assert_eq!(profile.mismatch(&profile.clone()), None);
    }

    #[test]
    fn what_either_side_does_not_say_never_keeps_a_pair_apart() {
        let said = PdProfile {
            transfer_backend: Some("nixl".into()),
            kv_cache_dtype: Some("fp8_e4m3".into()),
            ..sizes(64, 3, 4)
        };
        assert_eq!(said.mismatch(&PdProfile::default()), None);
        assert_eq!(PdProfile::default().mismatch(&said), None);
    }

    #[test]
    fn each_field_names_itself_and_both_values() {
        let backend = |b: &str| PdProfile {
            transfer_backend: Some(b.into()),
            ..PdProfile::default()
        };
        let dtype = |t: &str| PdProfile {
            kv_cache_dtype: Some(t.into()),
            ..PdProfile::default()
        };
        let cases = [
            (
                backend("mooncake"),
                backend("nixl"),
                "disaggregation_transfer_backend",
                ("mooncake", "nixl"),
            ),
            (
                dtype("auto"),
                dtype("fp8_e5m2"),
                "kv_cache_dtype",
                ("auto", "fp8_e5m2"),
            ),
            (sizes(16, 1, 1), sizes(32, 1, 1), "page_size", ("16", "32")),
            (
                sizes(16, 2, 1),
                sizes(16, 3, 1),
                "attention_tp_size",
                ("2", "3"),
            ),
            (sizes(16, 1, 2), sizes(16, 1, 4), "pp_size", ("2", "4")),
        ];
        for (prefill, decode, field, (p, d)) in cases {
            let mismatch = prefill.mismatch(&decode).expect(field);
            assert_eq!(mismatch.field(), field);
            assert_eq!(mismatch.values(), (p.to_owned(), d.to_owned()));
            let said = mismatch.to_string();
            assert!(
                said.starts_with(&format!("{field} {p} (prefill) and {d} (decode)")),
                "{said}"
            );
        }
    }

    #[test]
    fn tensor_parallel_sizes_pair_when_one_divides_the_other() {
        for (prefill, decode) in [(1, 8), (8, 1), (2, 4), (4, 2), (4, 4)] {
            assert_eq!(sizes(16, prefill, 1).mismatch(&sizes(16, decode, 1)), None);
        }
        assert!(sizes(16, 4, 1).mismatch(&sizes(16, 6, 1)).is_some());
    }

    #[test]
    fn a_decode_engine_has_the_prefill_engines_pipeline_stages_or_one() {
        assert_eq!(sizes(16, 1, 4).mismatch(&sizes(16, 1, 1)), None);
        assert_eq!(sizes(16, 1, 4).mismatch(&sizes(16, 1, 4)), None);
        assert!(sizes(16, 1, 1).mismatch(&sizes(16, 1, 2)).is_some());
    }

    #[test]
    fn the_first_disagreement_is_the_one_named() {
        let prefill = PdProfile {
            transfer_backend: Some("mooncake".into()),
            ..sizes(16, 1, 1)
        };
        let decode = PdProfile {
            transfer_backend: Some("nixl".into()),
            ..sizes(32, 1, 1)
        };
        assert_eq!(
            prefill.mismatch(&decode).map(|m| m.field()),
            Some("disaggregation_transfer_backend")
        );
    }
}
