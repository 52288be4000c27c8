-- wrk script: small streamed completions (SSE).
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"sim-model","prompt":"hello there, how are you today?","max_tokens":8,"stream":true}'
