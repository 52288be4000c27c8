//! Routes a few requests through the embedded core and prints where each went.

use embedded_gateway::Gateway;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let gateway = Gateway::new(
        &[
            ("s1", "http://10.0.0.1:8000"),
            ("s2", "http://10.0.0.2:8000"),
        ],
        &[
            ("l1", "http://10.0.1.1:8000"),
            ("l2", "http://10.0.1.2:8000"),
        ],
    )?;
    // The gateway's own measurements: s1 is busy, s2 has its queue full.
    gateway.report("s1", 12, 2)?;
    gateway.report("s2", 3, 4)?;
    for input_tokens in [300, 2_000, 9_000] {
        let routed = gateway.route(input_tokens).await?;
        println!(
            "{input_tokens:>5} prompt tokens -> {} (bucket {})",
            routed.engine, routed.bucket
        );
    }
    gateway.report("s1", 12, 4)?;
    let routed = gateway.route(300).await?;
    println!(
        "  300 prompt tokens, every short engine's queue full -> {} (bucket {})",
        routed.engine, routed.bucket
    );
    Ok(())
}
