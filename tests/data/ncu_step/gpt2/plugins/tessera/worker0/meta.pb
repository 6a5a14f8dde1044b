worker0"vm(è8BƒNVIDIA H100 80GB HBM3€€ÀÛ¼ 	0„:İ{"maxThreadsPerBlock":1024,"maxThreadsPerMultiprocessor":2048,"regsPerBlock":65536,"warpSize":32,"sharedMemPerBlock":49152,"regsPerMultiprocessor":65536,"sharedMemPerBlockOptin":232448,"sharedMemPerMultiprocessor":233472}H€¨øñ ß™íR
cuda_driver13000R
tessera0.1.0R
cuda_runtime13000R
kineto_schema1R
cupti130001R
torch2.11.0+cu130rcapturez¾{"schemaVersion":1,"trace_id":"EAE5EE4903D34B2A998E2BD41D5D6B93","profile_memory":1,"cuda_driver_version":13000,"record_shapes":1,"cuda_runtime_version":13000,"cupti_version":130001,"displayTimeUnit":"ms","baseTimeNanoseconds":1790857026000000000,"traceName":"/dev/shm/tessera-capture-488-tmq01euu/window_000000.json"}‚¤çÿïºÈõ ˜İÙùºÈõ(Û‚˜İÙùºÈõ ÄüÁƒºÈõ(Ù‚ÄüÁƒºÈõ ¶ª»ºÈõ(ÛŠ
host_regionsokŠ@
ncu_countersunavailable#no-ncu: run tessera-prof import-ncuŠ

nvmlokŠ
cpu_opsokŠ
device_activityokŠ
memcpyokŠA
collectivesunavailable%not requested (activity 'collective')Š
memoryokŠ
shapesokŠ'
stacksunavailablewith_stack=FalseŠ
torch_profilerok’capture