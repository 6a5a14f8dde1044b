worker0"vm(Â8BƒNVIDIA H100 80GB HBM3€€ÀÛ¼ 	0„:Ý{"maxThreadsPerBlock":1024,"maxThreadsPerMultiprocessor":2048,"regsPerBlock":65536,"warpSize":32,"sharedMemPerBlock":49152,"regsPerMultiprocessor":65536,"sharedMemPerBlockOptin":232448,"sharedMemPerMultiprocessor":233472}H€¨øñ ß™íR
kineto_schema1R
cuda_runtime13000R
torch2.11.0+cu130R
cuda_driver13000R
cupti130001R
tessera0.1.0rcapturez¾{"schemaVersion":1,"trace_id":"F47801D9F90844DDA28C64B00D7BB108","profile_memory":1,"cuda_driver_version":13000,"record_shapes":1,"cuda_runtime_version":13000,"cupti_version":130001,"displayTimeUnit":"ms","baseTimeNanoseconds":1790857026000000000,"traceName":"/dev/shm/tessera-capture-578-d6kpbh8o/window_000000.json"}‚¢å€ƒîºÈõ ë™ò”îºÈõ(z‚ë™ò”îºÈõ ™ªõžîºÈõ(w‚™ªõžîºÈõ ‡ˆû¨îºÈõ(‡Š
host_regionsokŠ5
nvmlunavailable not requested (activity 'power')Š@
ncu_countersunavailable#no-ncu: run tessera-prof import-ncuŠ
cpu_opsokŠ
device_activityokŠ
memcpyokŠA
collectivesunavailable%not requested (activity 'collective')Š
memoryokŠ
shapesokŠ'
stacksunavailablewith_stack=FalseŠ
torch_profilerok’capture