worker0"vm(Ì8BùNVIDIA H200€€ü™¯ 	0„:İ{"maxThreadsPerBlock":1024,"maxThreadsPerMultiprocessor":2048,"regsPerBlock":65536,"warpSize":32,"sharedMemPerBlock":49152,"regsPerMultiprocessor":65536,"sharedMemPerBlockOptin":232448,"sharedMemPerMultiprocessor":233472}BûNVIDIA H200€€ü™¯ 	0„:İ{"maxThreadsPerBlock":1024,"maxThreadsPerMultiprocessor":2048,"regsPerBlock":65536,"warpSize":32,"sharedMemPerBlock":49152,"regsPerMultiprocessor":65536,"sharedMemPerBlockOptin":232448,"sharedMemPerMultiprocessor":233472}H€¨øñ ß™íR
cupti130001R
cuda_driver13000R
kineto_schema1R
tessera0.1.0R
cuda_runtime13000R
torch2.11.0+cu130rcapturez¾{"schemaVersion":1,"trace_id":"5AC65644FA07412CB63E65C10BE5FB9C","profile_memory":1,"cuda_driver_version":13000,"record_shapes":1,"cuda_runtime_version":13000,"cupti_version":130001,"displayTimeUnit":"ms","baseTimeNanoseconds":1790857026000000000,"traceName":"/dev/shm/tessera-capture-588-42jgr7oq/window_000000.json"}‚™Ñåêª”õ Š˜·êêª”õ(ø‚İß¹êêª”õ ü¤ˆğêª”õ(ø‚¸à‘•ëª”õ ÈÚî™ëª”õ(÷‚	¾àñ™ëª”õ ÆõÃëª”õ(÷Š
host_regionsokŠ@
ncu_countersunavailable#no-ncu: run tessera-prof import-ncuŠ

nvmlokŠ
cpu_opsokŠ
device_activityokŠ
memcpyokŠ
collectivesokŠ
memoryokŠ
shapesokŠ'
stacksunavailablewith_stack=FalseŠ
torch_profilerok’capture