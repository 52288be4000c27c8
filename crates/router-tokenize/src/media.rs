//! The tokens a chat's image, audio or video part is counted as: the router cannot
//! make what the engine's processor makes of one, so it counts a bound of it, and a
//! prompt holding media is never counted shorter than the engine sees it while each
//! part is within the bound.

use std::path::Path;

use serde_json::Value;

/// The tokens a media part is counted as when the model's processor names no bound:
/// the most Qwen2-VL's and Qwen2.5-VL's image processors make of one image at their
/// default `max_pixels` (12,845,056 pixels in 28 x 28 patches). Other processors make
/// fewer (LLaVA-1.5 576, Llama 3.2 Vision at most 6,404, Gemma 3 256); a video can
/// make more, so a model served with videos sets its own.
pub const DEFAULT_MEDIA_PART_TOKENS: u32 = 16_384;

/// The bound the `preprocessor_config.json` beside `tokenizer` gives, for a
/// processor that merges patches of a bounded image as Qwen2-VL's does (the most
/// pixels over the pixels a token stands for); else [`DEFAULT_MEDIA_PART_TOKENS`].
pub(crate) fn part_tokens(tokenizer: &Path) -> u32 {
    let path = tokenizer.with_file_name("preprocessor_config.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return DEFAULT_MEDIA_PART_TOKENS;
    };
    match serde_json::from_str::<Value>(&text)
        .ok()
        .as_ref()
        .and_then(merged_patches_bound)
    {
        Some(tokens) => tokens,
        None => {
            tracing::debug!(
                file = %path.display(),
                tokens = DEFAULT_MEDIA_PART_TOKENS,
                "the processor's configuration names no bound on the tokens of an image: each media part is counted at the default"
            );
            DEFAULT_MEDIA_PART_TOKENS
        }
    }
}

/// `max_pixels` (or `size.longest_edge`, where newer files keep it) over the pixels
/// one token stands for, `(patch_size * merge_size)^2`, rounded up.
fn merged_patches_bound(config: &Value) -> Option<u32> {
    let number = |v: &Value| v.as_u64().filter(|&n| n > 0);
    let max_pixels =
        number(&config["max_pixels"]).or_else(|| number(&config["size"]["longest_edge"]))?;
    let side = number(&config["patch_size"])?.checked_mul(number(&config["merge_size"])?)?;
    let per_token = side.checked_mul(side)?;
    u32::try_from(max_pixels.div_ceil(per_token)).ok()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_qwen_vl_processor_bounds_an_image_by_its_most_pixels() {
        let old = json!({"max_pixels": 12_845_056, "min_pixels": 3136, "patch_size": 14, "merge_size": 2});
        assert_eq!(merged_patches_bound(&old), Some(16_384));
        let new = json!({"size": {"longest_edge": 1_003_520, "shortest_edge": 3136}, "patch_size": 14, "merge_size": 2});
        assert_eq!(merged_patches_bound(&new), Some(1280));
        let other = json!({"crop_size": 336, "image_mean": [0.5]});
        assert_eq!(merged_patches_bound(&other), None);
        assert_eq!(
            merged_patches_bound(&json!({"max_pixels": 10, "patch_size": 0, "merge_size": 2})),
            None
        );
    }

    #[test]
    fn without_a_processor_file_each_part_counts_the_default() {
        let dir = std::env::temp_dir().join(format!("switchyard-media-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let tokenizer = dir.join("tokenizer.json");
        assert_eq!(part_tokens(&tokenizer), DEFAULT_MEDIA_PART_TOKENS);
        std::fs::write(
            dir.join("preprocessor_config.json"),
            json!({"max_pixels": 200_704, "patch_size": 14, "merge_size": 2}).to_string(),
        )
        .unwrap();
        assert_eq!(part_tokens(&tokenizer), 256);
        std::fs::write(dir.join("preprocessor_config.json"), "not json").unwrap();
        assert_eq!(part_tokens(&tokenizer), DEFAULT_MEDIA_PART_TOKENS);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
