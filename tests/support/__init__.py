"""What the tests share: the broker finder and topic helpers, the worker harness,
the golden cases' loader, the reference metrics, the native-decoder check, the
Prometheus server, SGLang ``meta_info`` fixtures and tool lookup."""
