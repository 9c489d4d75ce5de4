from sxwl.agent.main import main

main()
