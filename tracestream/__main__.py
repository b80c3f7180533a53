from tracestream.cli.main import main

main()
