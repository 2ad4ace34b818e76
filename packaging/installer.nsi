; vramgate's Windows installer: per user, no administrator rights, as Ollama installs
; into {localappdata}\Programs. Built by packaging/build_installer.py (on Linux with
; Debian's nsis, on the Windows runner with NSIS's own), which passes:
;   VERSION      the app's version (app/__init__.py)
;   BUNDLE       the built one-folder bundle (dist/vramgate)
;   BUNDLE_LIST  an include of the bundle's top-level entries, for the uninstaller
;   OUTFILE      the installer to write
;   ICON         the app's icon (optional)
;   TARGET       the installer stub (optional; amd64-unicode unless given)
;   SIGN         a command that signs "%1" in place (optional: Authenticode with a
;                timestamp, packaging/README.md); signs the uninstaller and the installer
;
; Silent use (what tests/packaging/test_installer_wine.py runs under Wine):
;   vramgate-setup.exe /S [/AUTOSTART] [/D=C:\another\folder]
;   uninstall.exe /S [/PURGE]       (/PURGE: also the models, logs and settings)
;
; What it leaves on the machine, and what the uninstaller removes:
;   $INSTDIR (default %LOCALAPPDATA%\Programs\vramgate): the bundle and uninstall.exe
;   Start menu: vramgate.lnk
;   HKCU\Software\Microsoft\Windows\CurrentVersion\Uninstall\vramgate ("Apps & features")
;   HKCU\...\Run\vramgate only when "Start at login" is chosen (off by default); the tray's
;     own menu item writes the same value (tray/autostart.py)
; Kept unless asked: %LOCALAPPDATA%\vramgate (models, logs, config.toml: the default
; folders of app/config/settings.py, platformdirs' on Windows).

Unicode true
; amd64-unicode: the app is 64-bit only, and Wine runs this stub without wine32. NSIS's
; own Windows distribution has no amd64 stubs (Debian's package builds them): the Windows
; runner passes TARGET=x86-unicode, a 32-bit installer that writes the same per-user
; keys (HKCU's Run and Uninstall keys are shared by 32- and 64-bit programs).
!ifndef TARGET
  !define TARGET "amd64-unicode"
!endif
Target "${TARGET}"
ManifestDPIAware true
RequestExecutionLevel user
SetCompressor /SOLID lzma
SetCompressorDictSize 64  ; MiB: the bundle's many similar DLLs share one dictionary

!ifndef VERSION | BUNDLE | BUNDLE_LIST | OUTFILE
  !error "packaging/build_installer.py passes VERSION, BUNDLE, BUNDLE_LIST and OUTFILE"
!endif

!define APP "vramgate"
!define UNINSTALL_KEY "Software\Microsoft\Windows\CurrentVersion\Uninstall\${APP}"
!define RUN_KEY "Software\Microsoft\Windows\CurrentVersion\Run"
!define APPROVED_KEY "Software\Microsoft\Windows\CurrentVersion\Explorer\StartupApproved\Run"

!include "MUI2.nsh"
!include "FileFunc.nsh"
!include "LogicLib.nsh"
!include "StrFunc.nsh"
!include "${BUNDLE_LIST}"
${StrStr}
${UnStrStr}

Name "${APP}"
OutFile "${OUTFILE}"
InstallDir "$LOCALAPPDATA\Programs\${APP}"
InstallDirRegKey HKCU "${UNINSTALL_KEY}" "InstallLocation"  ; an upgrade goes where it was
BrandingText "${APP} ${VERSION}"
VIProductVersion "${VERSION}.0"
VIAddVersionKey "ProductName" "${APP}"
VIAddVersionKey "ProductVersion" "${VERSION}"
VIAddVersionKey "FileVersion" "${VERSION}"
VIAddVersionKey "FileDescription" "${APP} installer"
VIAddVersionKey "LegalCopyright" "${APP}"

!ifdef SIGN
  !finalize '${SIGN}'
  !uninstfinalize '${SIGN}'
!endif
!ifdef ICON
  !define MUI_ICON "${ICON}"
  !define MUI_UNICON "${ICON}"
!endif

!define MUI_COMPONENTSPAGE_NODESC
!define MUI_FINISHPAGE_RUN "$INSTDIR\${APP}.exe"
!define MUI_FINISHPAGE_RUN_TEXT "Start ${APP} now"
!insertmacro MUI_PAGE_DIRECTORY
!insertmacro MUI_PAGE_COMPONENTS
!insertmacro MUI_PAGE_INSTFILES
!insertmacro MUI_PAGE_FINISH
!insertmacro MUI_UNPAGE_CONFIRM
!insertmacro MUI_UNPAGE_INSTFILES
!insertmacro MUI_LANGUAGE "English"

; Ends the tray and the server it runs (the tray's job object ends the server's model
; runners with it), and a server started by hand: their files are in use until then.
; taskkill ends only this user's processes without administrator rights.
!macro STOP_APP
  nsExec::Exec 'taskkill /F /T /IM "${APP}.exe"'
  Pop $0
  nsExec::Exec 'taskkill /F /T /IM "${APP}-cli.exe"'
  Pop $0
  Sleep 500  ; Windows lets go of the executables' files a moment after the processes end
!macroend

Section "${APP}" SecApp
  SectionIn RO
  !insertmacro STOP_APP
  ; an upgrade: the previous version's libraries go first, none of them left stale
  !insertmacro REMOVE_BUNDLE
  SetOutPath "$INSTDIR"
  File /r "${BUNDLE}\*.*"
  WriteUninstaller "$INSTDIR\uninstall.exe"
  CreateShortcut "$SMPROGRAMS\${APP}.lnk" "$INSTDIR\${APP}.exe"
  WriteRegStr HKCU "${UNINSTALL_KEY}" "DisplayName" "${APP}"
  WriteRegStr HKCU "${UNINSTALL_KEY}" "DisplayVersion" "${VERSION}"
  WriteRegStr HKCU "${UNINSTALL_KEY}" "Publisher" "${APP}"
  WriteRegStr HKCU "${UNINSTALL_KEY}" "DisplayIcon" "$INSTDIR\${APP}.exe"
  WriteRegStr HKCU "${UNINSTALL_KEY}" "InstallLocation" "$INSTDIR"
  WriteRegStr HKCU "${UNINSTALL_KEY}" "UninstallString" '"$INSTDIR\uninstall.exe"'
  WriteRegStr HKCU "${UNINSTALL_KEY}" "QuietUninstallString" '"$INSTDIR\uninstall.exe" /S'
  WriteRegDWORD HKCU "${UNINSTALL_KEY}" "NoModify" 1
  WriteRegDWORD HKCU "${UNINSTALL_KEY}" "NoRepair" 1
  ${GetSize} "$INSTDIR" "/S=0K" $0 $1 $2  ; "Apps & features" reads KiB
  WriteRegDWORD HKCU "${UNINSTALL_KEY}" "EstimatedSize" $0
SectionEnd

; Off by default. The value is what the tray's "Start at login" writes (tray/autostart.py:
; the windowed executable, quoted); any Task Manager "disabled" flag is cleared with it.
Section /o "Start ${APP} at login" SecAutostart
  WriteRegStr HKCU "${RUN_KEY}" "${APP}" '"$INSTDIR\${APP}.exe"'
  DeleteRegValue HKCU "${APPROVED_KEY}" "${APP}"
SectionEnd

Function .onInit
  ${GetParameters} $R0
  ClearErrors
  ${GetOptions} $R0 "/AUTOSTART" $R1
  ${IfNot} ${Errors}
    SectionSetFlags ${SecAutostart} ${SF_SELECTED}
  ${EndIf}
FunctionEnd

Section "Uninstall"
  !insertmacro STOP_APP
  ; the Run value and Task Manager's flag, where they start this copy (another copy's,
  ; a developer's venv, is left alone)
  ReadRegStr $0 HKCU "${RUN_KEY}" "${APP}"
  ${UnStrStr} $1 $0 "$INSTDIR\${APP}.exe"
  ${If} $1 != ""
    DeleteRegValue HKCU "${RUN_KEY}" "${APP}"
    DeleteRegValue HKCU "${APPROVED_KEY}" "${APP}"
  ${EndIf}
  Delete "$SMPROGRAMS\${APP}.lnk"
  DeleteRegKey HKCU "${UNINSTALL_KEY}"
  !insertmacro REMOVE_BUNDLE
  Delete "$INSTDIR\uninstall.exe"
  RMDir "$INSTDIR"  ; only when empty: nothing of the person's is removed with it
  ; models, logs and settings: only when asked (/PURGE, or Yes below; silent keeps them)
  ${GetParameters} $R0
  ClearErrors
  ${GetOptions} $R0 "/PURGE" $R1
  ${If} ${Errors}
    MessageBox MB_YESNO|MB_ICONQUESTION|MB_DEFBUTTON2 \
      "Also delete your models, logs and settings in $LOCALAPPDATA\${APP}?" \
      /SD IDNO IDYES purge
    Goto done
  ${EndIf}
  purge:
    RMDir /r "$LOCALAPPDATA\${APP}"
  done:
SectionEnd
