from hkgpu_tune.cli import main

main()
