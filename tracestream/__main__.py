from tracestream.cli import main

main()
