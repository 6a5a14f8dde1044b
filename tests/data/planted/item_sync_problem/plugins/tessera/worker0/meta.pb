worker0"vm(µ8BÉNVIDIA H100 80GB HBM3ÄÄ¿€º 	0Ñ:›{"maxThreadsPerBlock":1024,"maxThreadsPerMultiprocessor":2048,"regsPerBlock":65536,"warpSize":32,"sharedMemPerBlock":49152,"regsPerMultiprocessor":65536,"sharedMemPerBlockOptin":232448,"sharedMemPerMultiprocessor":233472}HÄ®¯Ò†ﬂôÌR
cuda_driver13000R
cuda_runtime13000R
cupti130001R
kineto_schema1R
tessera0.1.0R
torch2.11.0+cu130rcapturezÕ{"schemaVersion":1,"trace_id":"FBC7FCD548954C93AE274AE1ED7E9D36","with_stack":1,"profile_memory":1,"cuda_driver_version":13000,"record_shapes":1,"cuda_runtime_version":13000,"cupti_version":130001,"displayTimeUnit":"ms","baseTimeNanoseconds":1790857026000000000,"traceName":"/dev/shm/tessera-capture-437-cisx7iu0/window_000000.json"}Çè»êü”‚…ı  ö∏´”‚…ı(€Ç ö∏´”‚…ı ÍÍä¥”‚…ı(ÇÍÍä¥”‚…ı ©Ñ›º”‚…ı(ºä
host_regionsokä5
nvmlunavailable not requested (activity 'power')äM
ncu_countersunavailable0no-ncu: run tessera-prof counters RUN -- PROGRAMä
cpu_opsokä
device_activityokä
memcpyokäA
collectivesunavailable%not requested (activity 'collective')ä
memoryokä
shapesokä
stacksokä
torch_profilerokícapture