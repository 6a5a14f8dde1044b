worker0"vm(ü8BÉNVIDIA H100 80GB HBM3ÄÄ¿€º 	0Ñ:›{"maxThreadsPerBlock":1024,"maxThreadsPerMultiprocessor":2048,"regsPerBlock":65536,"warpSize":32,"sharedMemPerBlock":49152,"regsPerMultiprocessor":65536,"sharedMemPerBlockOptin":232448,"sharedMemPerMultiprocessor":233472}HÄ®¯Ò†ﬂôÌR
cuda_runtime13000R
tessera0.1.0R
cupti130001R
cuda_driver13000R
torch2.11.0+cu130R
kineto_schema1rcapturezæ{"schemaVersion":1,"trace_id":"AB2D0AA69F2440819704E271E858509F","profile_memory":1,"cuda_driver_version":13000,"record_shapes":1,"cuda_runtime_version":13000,"cupti_version":130001,"displayTimeUnit":"ms","baseTimeNanoseconds":1790857026000000000,"traceName":"/dev/shm/tessera-capture-543-qrr11qw3/window_000000.json"}ÇÄ≥ùƒΩ∫»ı ı’€Ω∫»ı(Ω<Ç’ÛÛ€Ω∫»ı ˆÌ≠ÚΩ∫»ı(ª<ÇŸí±ÚΩ∫»ı Ç§ûæ∫»ı(Ω<ä
host_regionsokä@
ncu_countersunavailable#no-ncu: run tessera-prof import-ncuä

nvmlokä
cpu_opsokä
device_activityokä
memcpyokäA
collectivesunavailable%not requested (activity 'collective')ä
memoryokä
shapesokä'
stacksunavailablewith_stack=Falseä
torch_profilerokícapture