-- wrk script: small streamed chat completions (SSE).
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"sim-model","messages":[{"role":"user","content":"hello there, how are you today?"}],"max_tokens":8,"stream":true}'
