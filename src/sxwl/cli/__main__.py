from sxwl.cli.main import main

main()
