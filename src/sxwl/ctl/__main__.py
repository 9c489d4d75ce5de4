from sxwl.ctl.main import main

main()
