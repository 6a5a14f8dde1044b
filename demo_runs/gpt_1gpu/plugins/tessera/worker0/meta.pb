worker0(Ä0ÿÿÿÿÿÿÿÿÿBùNVIDIA H200€€ü™¯ 	0„:Ý{"maxThreadsPerBlock":1024,"maxThreadsPerMultiprocessor":2048,"regsPerBlock":65536,"warpSize":32,"sharedMemPerBlock":49152,"regsPerMultiprocessor":65536,"sharedMemPerBlockOptin":232448,"sharedMemPerMultiprocessor":233472}BûNVIDIA H200€€ü™¯ 	0„:Ý{"maxThreadsPerBlock":1024,"maxThreadsPerMultiprocessor":2048,"regsPerBlock":65536,"warpSize":32,"sharedMemPerBlock":49152,"regsPerMultiprocessor":65536,"sharedMemPerBlockOptin":232448,"sharedMemPerMultiprocessor":233472}H€¨øñ ß™íR
cuda_driver13000R
kineto_schema1R
cuda_runtime13000R
cupti130001R
tessera0.1.0j,worker0.1795329712413686982.pt.trace.json.gzrkinetoz¹{"schemaVersion":1,"trace_id":"9B9ADB2755F243A2B6E556453EDB8772","with_stack":1,"profile_memory":1,"cuda_driver_version":13000,"record_shapes":1,"with_flops":1,"cuda_runtime_version":13000,"cupti_version":130001,"displayTimeUnit":"ms","baseTimeNanoseconds":1790857026000000000,"traceName":"/tmp/tmp2em5tvgc.json"}‚ä…ÝÏÇÛ’õ ß¢ØéÇÛ’õ(ž$‚ùíÚéÇÛ’õ ¿„´€ÈÛ’õ(›$Š
device_activityokŠ
shapesokŠ
stacksokŠ
memoryokŠ

nvmlokŠa
cupti_range_countersunavailable<no cuda_profiler_range events (CUPTI range profiler was off)ŠI
ncu_countersok5Nsight Compute gpt_step_raw.csv: 120 profiled kernelsŠs
ncu_kernel_matchok[matched by kernel name and launch order from a separate process: 98 of 120 profiled kernels’import